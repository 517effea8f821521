//! Adversarial: the dump signal with two runtimes in one process.
//! spec/sched.md: on the signal, "each runtime's monitor prints its dump".
//! One shared flag let the first monitor to look take the request, so one
//! signal printed one runtime's dump; and the handler was installed once
//! per process whatever the signal, so a second runtime configured with
//! `SIGUSR2` never got its handler and the signal killed the process.

use std::process::Command;

mod common;
use common::ms;

const CHILD: &str = "FIBER_ADVERSARIAL_DUMPSIG_CHILD";

fn child(test: &str, envs: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, test);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FIBER_") {
            cmd.env_remove(name);
        }
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn is_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// Send `sig` to this process (through `kill`, as an operator would).
fn raise(sig: &str) {
    let st = Command::new("kill")
        .args([format!("-{sig}"), std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

fn park_a_named_fiber(rt: &fiber::Runtime, name: &'static str) {
    rt.spawn(move || {
        fiber::Builder::new().name(name).spawn(fiber::park).unwrap();
    })
    .join()
    .unwrap();
}

#[test]
fn one_dump_signal_prints_every_runtimes_dump() {
    const T: &str = "one_dump_signal_prints_every_runtimes_dump";
    if is_child(T) {
        let a = fiber::Runtime::builder().workers(1).build().unwrap();
        let b = fiber::Runtime::builder().workers(1).build().unwrap();
        park_a_named_fiber(&a, "fiber-of-runtime-a");
        park_a_named_fiber(&b, "fiber-of-runtime-b");
        std::thread::sleep(ms(100));
        raise("USR1");
        std::thread::sleep(ms(500));
        return;
    }
    let out = child(
        T,
        &[("FIBER_DUMP_SIGNAL", "SIGUSR1"), ("FIBER_SHUTDOWN_TIMEOUT_MS", "100")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(
        stderr.contains("fiber-of-runtime-a") && stderr.contains("fiber-of-runtime-b"),
        "one signal should print both runtimes' dumps:\n{stderr}"
    );
}

#[test]
fn two_runtimes_may_use_different_dump_signals() {
    const T: &str = "two_runtimes_may_use_different_dump_signals";
    if is_child(T) {
        let ca = fiber::Config {
            dump_signal: Some(10), // SIGUSR1
            ..Default::default()
        };
        let cb = fiber::Config {
            dump_signal: Some(12), // SIGUSR2
            ..Default::default()
        };
        let a = fiber::Runtime::with_config(ca).unwrap();
        let b = fiber::Runtime::with_config(cb).unwrap();
        park_a_named_fiber(&a, "fiber-of-runtime-a");
        park_a_named_fiber(&b, "fiber-of-runtime-b");
        std::thread::sleep(ms(100));
        raise("USR2");
        std::thread::sleep(ms(500));
        println!("CHILD-SURVIVED");
        return;
    }
    let out = child(T, &[("FIBER_SHUTDOWN_TIMEOUT_MS", "100")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-SURVIVED"),
        "runtime b asked for SIGUSR2 dumps; the process got {:?}\n{stderr}",
        out.status
    );
    // Only the runtime configured with SIGUSR2 prints.
    assert!(stderr.contains("fiber-of-runtime-b"), "{stderr}");
    assert!(!stderr.contains("fiber-of-runtime-a"), "{stderr}");
}

#[test]
fn after_the_last_runtime_the_signal_does_what_it_did_before() {
    // SIGUSR1's default action ends the process. While a runtime asks for
    // dumps on it, the signal prints a dump instead; once that runtime is
    // gone the handler must go too, not swallow the signal for ever.
    const T: &str = "after_the_last_runtime_the_signal_does_what_it_did_before";
    if is_child(T) {
        let rt = fiber::Runtime::new().unwrap();
        park_a_named_fiber(&rt, "fiber-while-the-runtime-lives");
        raise("USR1");
        std::thread::sleep(ms(300));
        println!("SURVIVED-WHILE-THE-RUNTIME-LIVED");
        drop(rt);
        raise("USR1");
        std::thread::sleep(ms(500));
        println!("SURVIVED-AFTER-THE-RUNTIME");
        return;
    }
    let out = child(
        T,
        &[("FIBER_DUMP_SIGNAL", "SIGUSR1"), ("FIBER_SHUTDOWN_TIMEOUT_MS", "100")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    use std::os::unix::process::ExitStatusExt;
    assert!(
        stdout.contains("SURVIVED-WHILE-THE-RUNTIME-LIVED"),
        "{stdout}\n{stderr}"
    );
    assert!(stderr.contains("fiber-while-the-runtime-lives"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGUSR1),
        "with no runtime left, SIGUSR1 should end the process as by default; got {:?}\n{stdout}",
        out.status
    );
}

static APP_HANDLER_CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn app_handler(_signal: libc::c_int) {
    APP_HANDLER_CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// Wait (bounded) until the application's handler has run `n` times.
fn app_calls_reach(n: usize) -> bool {
    let deadline = std::time::Instant::now() + ms(5_000);
    while std::time::Instant::now() < deadline {
        if APP_HANDLER_CALLS.load(std::sync::atomic::Ordering::SeqCst) >= n {
            return true;
        }
        std::thread::sleep(ms(5));
    }
    false
}

#[test]
fn the_applications_own_handler_still_runs_and_comes_back() {
    const T: &str = "the_applications_own_handler_still_runs_and_comes_back";
    if is_child(T) {
        // SAFETY: a zeroed sigaction is a valid empty value; the handler
        // only does an atomic add.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = app_handler as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()), 0);
        }
        let rt = fiber::Runtime::with_config(fiber::Config {
            dump_signal: Some(libc::SIGUSR2),
            ..Default::default()
        })
        .unwrap();
        park_a_named_fiber(&rt, "fiber-beside-the-app-handler");
        raise("USR2");
        assert!(
            app_calls_reach(1),
            "the application's handler was not called while the runtime lived"
        );
        std::thread::sleep(ms(300));
        drop(rt);
        raise("USR2");
        assert!(app_calls_reach(2), "the application's handler was not put back");
        // SAFETY: as above (reading the action only).
        let current = unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut current);
            current.sa_sigaction
        };
        assert_eq!(current, app_handler as *const () as libc::sighandler_t);
        println!("CHILD-DONE");
        return;
    }
    let out = child(T, &[("FIBER_SHUTDOWN_TIMEOUT_MS", "100")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE"),
        "{:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stderr.contains("fiber-beside-the-app-handler"), "{stderr}");
}

/// How the application's handler last found its stack: 1 on the thread's
/// alternate signal stack, 2 elsewhere (0 before it runs).
static APP_HANDLER_STACK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn app_handler_noting_its_stack(_signal: libc::c_int) {
    // SAFETY: `sigaltstack` with a null new stack only reads the current
    // one into `current`, a valid zeroed value; it is async-signal-safe.
    let on_alt = unsafe {
        let mut current: libc::stack_t = std::mem::zeroed();
        libc::sigaltstack(std::ptr::null(), &mut current) == 0 && current.ss_flags & libc::SS_ONSTACK != 0
    };
    APP_HANDLER_STACK.store(if on_alt { 1 } else { 2 }, std::sync::atomic::Ordering::SeqCst);
}

/// The dump signal can land on a fiber near the end of its (small) stack:
/// the handler must run on the thread's alternate signal stack, as the
/// guard-page handler does, or the signal frame itself overflows the fiber
/// stack and the diagnostic kills the process it should describe. The
/// handler it chains to runs in its frame, so it sees which stack that is.
#[test]
fn the_dump_signal_handler_runs_on_the_alternate_signal_stack() {
    const T: &str = "the_dump_signal_handler_runs_on_the_alternate_signal_stack";
    if is_child(T) {
        // SAFETY: a zeroed sigaction is a valid empty value; the handler
        // only reads its signal stack and stores to an atomic.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = app_handler_noting_its_stack as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()), 0);
        }
        let rt = fiber::Runtime::with_config(fiber::Config {
            dump_signal: Some(libc::SIGUSR2),
            ..Default::default()
        })
        .unwrap();
        rt.block_on(|| {
            // SAFETY: `raise` sends the signal to this thread, whose
            // handlers above are async-signal-safe.
            assert_eq!(unsafe { libc::raise(libc::SIGUSR2) }, 0);
        });
        assert_eq!(
            APP_HANDLER_STACK.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "the dump signal's handler ran on the fiber's stack, not the alternate signal stack"
        );
        println!("CHILD-DONE");
        return;
    }
    let out = child(T, &[("FIBER_SHUTDOWN_TIMEOUT_MS", "100")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE"),
        "{:?}\n{stdout}\n{stderr}",
        out.status
    );
}
