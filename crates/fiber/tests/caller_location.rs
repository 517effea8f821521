//! Misuse panics point at the caller's line and use the facade's names.

use std::cell::RefCell;
use std::panic::{self, catch_unwind, AssertUnwindSafe};
use std::time::Duration;

const ZERO: Duration = Duration::ZERO;

thread_local! {
    static LAST: RefCell<Option<(String, u32, String)>> = const { RefCell::new(None) };
}

/// Run `f` (expected to panic) and return the panic's (file, line, message).
fn panic_site(f: impl FnOnce()) -> (String, u32, String) {
    LAST.with(|l| l.borrow_mut().take());
    let result = catch_unwind(AssertUnwindSafe(f));
    assert!(result.is_err(), "expected a panic");
    LAST.with(|l| l.borrow_mut().take()).expect("the hook saw the panic")
}

#[test]
fn misuse_outside_a_fiber_points_at_the_callers_line() {
    panic::set_hook(Box::new(|info| {
        let location = info.location().expect("a location");
        let message = info
            .payload()
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        LAST.with(|l| *l.borrow_mut() = Some((location.file().to_owned(), location.line(), message)));
    }));
    macro_rules! case {
        ($name:expr, $call:expr) => {
            (
                $name,
                line!(),
                Box::new(|| {
                    let _ = $call;
                }) as Box<dyn FnOnce()>,
            )
        };
    }
    let cases = vec![
        case!("fiber::spawn", fiber::spawn(|| ())),
        case!("fiber::spawn_pinned", fiber::spawn_pinned(|| ())),
        case!("fiber::sleep", fiber::sleep(ZERO)),
        case!("fiber::sleep_until", fiber::sleep_until(std::time::Instant::now())),
        case!("fiber::current", fiber::current()),
        case!("fiber::stats", fiber::stats()),
        case!("fiber::dump", fiber::dump()),
        case!("fiber::scope", fiber::scope(|_| ())),
        case!("fiber::supervisor_scope", fiber::supervisor_scope(|_| ())),
        case!("fiber::try_scope", fiber::try_scope(|_| Ok::<(), ()>(()))),
        case!("fiber::with_timeout", fiber::with_timeout(ZERO, || ())),
        case!("fiber::Builder::spawn", fiber::Builder::new().spawn(|| ())),
        case!("fiber::Handle::current", fiber::Handle::current()),
        case!("fiber::Job::current", fiber::Job::current()),
    ];
    let seen: Vec<_> = cases
        .into_iter()
        .map(|(name, line, call)| (name, line, panic_site(call)))
        .collect();
    let _ = panic::take_hook();
    for (name, line, (file, at, message)) in seen {
        assert_eq!(
            (file.as_str(), at),
            (file!(), line),
            "{name}: the panic points at the caller ({message})"
        );
        assert!(
            message.contains(name),
            "{name}: the message uses the facade's name: {message}"
        );
        assert!(
            !message.contains("fiber_jobs::") && !message.contains("fiber_core::"),
            "{message}"
        );
    }
}
