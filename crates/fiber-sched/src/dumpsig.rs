//! `FIBER_DUMP_SIGNAL`: print the fiber dump when the process gets a signal
//! (for a stuck process in production, as Go does on SIGQUIT). The handler
//! only sets a flag (async-signal-safe); the monitor thread of each runtime
//! prints its dump at its next tick.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Relaxed: a request flag; the monitor prints whatever it sees then.
    REQUESTED.store(true, Ordering::Relaxed);
}

/// Install the handler for `signal` (once per process).
pub(crate) fn install(signal: libc::c_int) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid starting value; the
        // handler only stores to an atomic (async-signal-safe); SA_RESTART
        // keeps interrupted system calls going.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    });
}

/// Was a dump requested since the last call?
pub(crate) fn take_dump_request() -> bool {
    REQUESTED.load(Ordering::Relaxed) && REQUESTED.swap(false, Ordering::Relaxed)
}
