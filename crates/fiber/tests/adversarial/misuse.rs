//! Adversarial: fiber-only APIs called from plain threads, and runtime
//! misuse. Each call must either work (blocking the thread, as std does) or
//! panic with a message naming the misuse; never hang, never UB.

use fiber::chan;
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{ms, panic_message, rt, within};

/// A call on a plain thread either works or panics with a message that
/// contains `name`.
fn works_or_names(name: &str, f: impl FnOnce() + Send + 'static) {
    let name = name.to_string();
    within(20, move || {
        if let Some(msg) = panic_message(f) {
            assert!(msg.contains(&name), "a misuse panic must name `{name}`: {msg:?}");
        }
    })
}

#[test]
fn fiber_only_functions_on_a_plain_thread_panic_naming_themselves() {
    for (name, f) in [
        (
            "sleep_until",
            Box::new(|| {
                let _ = fiber::sleep_until(std::time::Instant::now());
            }) as Box<dyn FnOnce() + Send>,
        ),
        ("spawn_pinned", Box::new(|| drop(fiber::spawn_pinned(|| ())))),
        ("dump", Box::new(|| drop(fiber::dump()))),
        ("Builder::spawn", Box::new(|| drop(fiber::Builder::new().spawn(|| ())))),
    ] {
        let msg = within(20, move || panic_message(f)).unwrap_or_else(|| panic!("{name} on a thread must panic"));
        assert!(msg.contains(name), "the panic names {name}: {msg}");
    }
}

#[test]
fn cancellation_queries_on_a_plain_thread_report_not_cancelled() {
    within(20, || {
        assert!(!fiber::is_cancelled());
        assert!(fiber::check_cancelled().is_ok());
        assert!(
            fiber::yield_now().is_ok(),
            "yield_now on a thread is std::thread::yield_now"
        );
        assert!(fiber::Job::try_current().is_none());
        assert!(fiber::Handle::try_current().is_none());
        fiber::park_timeout(ms(1));
    })
}

#[test]
fn job_current_and_handle_current_on_a_plain_thread_panic_naming_themselves() {
    let msg = within(20, || panic_message(|| drop(fiber::Job::current()))).expect("Job::current must panic");
    assert!(msg.contains("Job::current"), "{msg}");
    let msg = within(20, || panic_message(|| drop(fiber::Handle::current()))).expect("Handle::current must panic");
    assert!(msg.contains("Handle::current"), "{msg}");
}

#[test]
fn scopes_on_a_plain_thread_work_or_name_the_misuse() {
    works_or_names("scope", || {
        let n = fiber::scope(|s| s.spawn(|| 2).join().unwrap());
        assert_eq!(n, 2);
    });
    works_or_names("try_scope", || {
        let r: Result<u8, &str> = fiber::try_scope(|s| Ok(s.spawn(|| Ok(3)).join().unwrap()));
        assert_eq!(r, Ok(3));
    });
    works_or_names("supervisor_scope", || {
        assert_eq!(fiber::supervisor_scope(|_| 4), 4);
    });
}

#[test]
fn with_timeout_on_a_plain_thread_works_or_names_the_misuse() {
    works_or_names("with_timeout", || {
        assert_eq!(fiber::with_timeout(ms(100), || 5), Ok(5));
    });
    works_or_names("with_timeout", || {
        let (_tx, rx) = chan::bounded::<u8>(0);
        let r = fiber::with_timeout(ms(20), || rx.recv());
        assert!(r.is_err() || r.unwrap().is_err(), "the wait cannot succeed");
    });
}

#[test]
fn blocking_on_a_plain_thread_works_or_names_the_misuse() {
    works_or_names("blocking", || {
        assert_eq!(fiber::blocking(|| 6), 6);
    });
}

#[test]
fn fiber_locals_on_plain_threads_are_per_thread() {
    fiber::fiber_local! {
        static N: std::cell::Cell<u32> = std::cell::Cell::new(0);
    }
    within(20, || {
        N.with(|n| n.set(5));
        let other = std::thread::spawn(|| N.with(|n| n.get())).join().unwrap();
        assert_eq!(other, 0, "another thread sees its own value");
        assert_eq!(N.with(|n| n.get()), 5);
        let in_fiber = rt().block_on(|| N.with(|n| n.get()));
        assert_eq!(
            in_fiber, 0,
            "a fiber sees its own value, not its worker thread's or the caller's"
        );
    })
}

#[test]
fn a_plain_thread_joins_and_cancels_fibers_and_waits_on_fiber_sync() {
    within(20, || {
        let rt = rt();
        let h = rt.spawn(|| {
            fiber::sleep(ms(10)).unwrap();
            9
        });
        assert_eq!(h.join().unwrap(), 9, "JoinHandle::join blocks a plain thread");
        let sleeper = rt.spawn(|| fiber::sleep(Duration::MAX));
        sleeper.cancel();
        assert!(sleeper.join().unwrap_err().is_cancelled());
        let sem = std::sync::Arc::new(fiber::sync::Semaphore::new(0));
        let s = sem.clone();
        rt.spawn(move || {
            fiber::sleep(ms(10)).unwrap();
            s.add_permits(1);
        });
        let permit = sem.acquire().expect("a plain thread is never cancelled");
        drop(permit);
        let wg = fiber::sync::WaitGroup::new();
        for _ in 0..4 {
            let wg = wg.clone();
            rt.spawn(move || {
                fiber::sleep(ms(5)).unwrap();
                drop(wg);
            });
        }
        wg.wait();
    })
}

#[test]
fn dropping_a_runtime_inside_one_of_its_own_fibers_panics_naming_the_misuse() {
    // A worker cannot join itself: the drop is refused with a message
    // (spec/reliability.md), never a deadlock.
    within(30, || {
        let rt = rt();
        let handle = rt.handle();
        let (tx, rx) = mpsc::channel();
        handle.spawn(move || {
            let msg = panic_message(move || drop(rt));
            let _ = tx.send(msg);
        });
        let msg = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the drop inside a fiber returned");
        // spec/reliability.md: refused with a clear message.
        let msg = msg.expect("dropping a runtime inside its own fiber panics");
        assert!(
            msg.to_lowercase().contains("runtime"),
            "the panic names the misuse: {msg}"
        );
    })
}

#[test]
fn dropping_a_second_runtime_inside_a_fiber_completes() {
    within(30, || {
        rt().block_on(|| {
            let inner = fiber::Runtime::builder().workers(1).build().unwrap();
            let h = inner.spawn(|| 1);
            assert_eq!(h.join().unwrap(), 1, "joining another runtime's fiber from a fiber");
            drop(inner);
        })
    })
}

#[test]
fn handle_block_on_from_a_thread_after_the_runtime_is_gone_panics_or_errors() {
    within(20, || {
        let rt = rt();
        let handle = rt.handle();
        drop(rt);
        assert!(handle.try_spawn(|| ()).is_err());
        if let Some(msg) = panic_message(|| handle.block_on(|| ())) {
            assert!(
                msg.to_lowercase().contains("shut"),
                "names the shut-down runtime: {msg}"
            );
        }
    })
}

#[test]
fn a_channel_shared_by_a_thread_and_a_fiber_survives_the_runtime() {
    // The runtime shuts down while a plain thread is blocked on a channel
    // whose other end lived in a fiber: the thread must see a disconnect.
    within(20, || {
        let rt = rt();
        let (tx, rx) = chan::bounded::<u8>(0);
        let t = std::thread::spawn(move || rx.recv());
        rt.spawn(move || {
            let _keep = tx;
            let _ = fiber::sleep(Duration::MAX);
        });
        std::thread::sleep(ms(20));
        drop(rt);
        assert!(
            t.join().unwrap().is_err(),
            "the sender died with its fiber: Disconnected"
        );
    })
}

#[test]
fn fiber_run_with_a_bad_fiber_env_value_panics_naming_the_variable() {
    const CHILD: &str = "FIBER_ADVERSARIAL_MISUSE_ENV_CHILD";
    let scenario = "fiber_run_with_a_bad_fiber_env_value_panics_naming_the_variable";
    if std::env::var(CHILD).is_ok() {
        fiber::run(|| ());
        return;
    }
    let scenario = crate::common::full_test_name(scenario);
    for (var, value) in [
        ("FIBER_WORKERS", "abc"),
        ("FIBER_STACK_SIZE", "99999999999999999999g"),
        ("FIBER_SHUTDOWN_TIMEOUT_MS", "-5"),
    ] {
        let scenario = scenario.clone();
        let out = within(30, move || {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", &scenario, "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env(var, value)
                .output()
                .unwrap()
        });
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{var}={value} was accepted");
        assert!(stderr.contains(var), "the panic names {var}: {stderr}");
        assert!(
            !stderr.contains("SIGABRT") && out.status.code().is_some(),
            "a panic, not an abort: {stderr}"
        );
    }
}

/// A fiber-only call inside a `fiber::blocking` closure (a plain pool
/// thread) panics naming that situation, not "there is no runtime here"
/// (following that advice would start a second runtime).
#[test]
fn a_fiber_only_call_inside_blocking_names_the_blocking_pool() {
    let msg = crate::common::on_runtime(|| {
        fiber::blocking(|| {
            crate::common::panic_message(|| {
                let _ = fiber::sleep(std::time::Duration::from_millis(1));
            })
        })
    });
    let msg = msg.expect("fiber::sleep panics on a blocking-pool thread");
    assert!(msg.contains("inside a fiber::blocking call"), "{msg}");
}

/// The same for the structured-concurrency calls: `scope`,
/// `supervisor_scope`, `try_scope` and `with_timeout` inside a blocking
/// closure said "called outside a fiber: ... start a runtime", which is
/// wrong advice while one runs.
#[test]
fn scopes_and_timeouts_inside_blocking_name_the_blocking_pool() {
    let msgs = crate::common::on_runtime(|| {
        fiber::blocking(|| {
            [
                crate::common::panic_message(|| fiber::scope(|_| ())),
                crate::common::panic_message(|| fiber::supervisor_scope(|_| ())),
                crate::common::panic_message(|| {
                    let _ = fiber::try_scope(|_| Ok::<(), String>(()));
                }),
                crate::common::panic_message(|| {
                    let _ = fiber::with_timeout(std::time::Duration::from_secs(1), || ());
                }),
            ]
        })
    });
    for (msg, what) in msgs
        .into_iter()
        .zip(["scope", "supervisor_scope", "try_scope", "with_timeout"])
    {
        let msg = msg.unwrap_or_else(|| panic!("fiber::{what} panics on a blocking-pool thread"));
        assert!(
            msg.contains(&format!("fiber::{what} called inside a fiber::blocking call")),
            "{msg}"
        );
    }
}

/// Misuse panics name the facade's paths and the user's own call: the
/// semaphore's said `fiber_sync::Semaphore::new`, and an empty `select!`
/// blamed `Select::select`, which the user never called.
#[test]
fn misuse_messages_name_what_the_user_wrote() {
    let msg = crate::common::panic_message(|| {
        let _ = fiber::sync::Semaphore::new(usize::MAX);
    })
    .expect("panics");
    assert!(msg.starts_with("fiber::sync::Semaphore::new"), "{msg}");
    let msg = crate::common::on_runtime(|| {
        crate::common::panic_message(|| {
            fiber::select! {}
        })
    })
    .expect("panics");
    assert!(msg.contains("select! without arms"), "{msg}");
}
