//! `FIBER_DUMP_SIGNAL`: print the fiber dump when the process gets a signal
//! (for a stuck process in production, as Go does on SIGQUIT). The handler
//! only counts the signal (async-signal-safe); the monitor thread of every
//! runtime configured with that signal prints its dump at its next tick,
//! once per count it has not seen yet. The signals allowed (`SIGUSR1`,
//! `SIGUSR2`) each have a count and a handler of their own, so two
//! runtimes may use different ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// Signals received, per allowed signal (`SIGUSR1`, `SIGUSR2`).
static RECEIVED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

fn slot(signal: libc::c_int) -> Option<usize> {
    match signal {
        libc::SIGUSR1 => Some(0),
        libc::SIGUSR2 => Some(1),
        _ => None,
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    if let Some(i) = slot(signal) {
        // Relaxed: a count; each monitor prints whatever it sees then.
        RECEIVED[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Install the handler of `signal` (once per signal; the configuration
/// allows only `SIGUSR1` and `SIGUSR2`).
pub(crate) fn install(signal: libc::c_int) {
    static ONCE: [Once; 2] = [Once::new(), Once::new()];
    let Some(i) = slot(signal) else {
        return;
    };
    ONCE[i].call_once(|| {
        // SAFETY: a zeroed `sigaction` is a valid empty value; the handler
        // only does an atomic add, which is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    });
}

/// One runtime's view of its dump signal: has it come since the last look?
pub(crate) struct DumpRequests {
    slot: Option<usize>,
    seen: u64,
}

impl DumpRequests {
    pub(crate) fn new(signal: Option<libc::c_int>) -> DumpRequests {
        let slot = signal.and_then(slot);
        DumpRequests {
            slot,
            seen: slot.map_or(0, |i| RECEIVED[i].load(Ordering::Relaxed)),
        }
    }

    /// Did the signal come since the last call (or since `new`)?
    pub(crate) fn take(&mut self) -> bool {
        let Some(i) = self.slot else {
            return false;
        };
        // Relaxed: see `on_signal`.
        let now = RECEIVED[i].load(Ordering::Relaxed);
        let new = now != self.seen;
        self.seen = now;
        new
    }
}
