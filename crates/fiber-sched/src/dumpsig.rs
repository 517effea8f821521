//! `FIBER_DUMP_SIGNAL`: print the fiber dump when the process gets a signal
//! (for a stuck process in production, as Go does on SIGQUIT). The handler
//! only counts the signal (async-signal-safe); the monitor thread of every
//! runtime configured with that signal prints its dump at its next tick,
//! once per count it has not seen yet. The signals allowed (`SIGUSR1`,
//! `SIGUSR2`) each have a count and a handler of their own, so two
//! runtimes may use different ones.
//!
//! The handler is installed while at least one runtime configured with its
//! signal lives (a count of registrations per signal): the first
//! registration saves the action it replaces, the last one to go puts that
//! action back, so after the last such runtime the signal does what it did
//! before (by default, end the process). While ours is installed, a
//! previous handler that was a function (the application's own) is still
//! called after the count, with the arguments it expects.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Signals received, per allowed signal (`SIGUSR1`, `SIGUSR2`).
static RECEIVED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The previous handler to chain to, per signal: its address (0 for none:
/// it was `SIG_DFL` or `SIG_IGN`) and whether it takes `siginfo`.
static CHAIN: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
static CHAIN_SIGINFO: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];

/// Per signal: live registrations and the action ours replaced. Changed
/// only under this lock (never in the handler).
static INSTALLED: Mutex<[(usize, Option<libc::sigaction>); 2]> = Mutex::new([(0, None), (0, None)]);

fn slot(signal: libc::c_int) -> Option<usize> {
    match signal {
        libc::SIGUSR1 => Some(0),
        libc::SIGUSR2 => Some(1),
        _ => None,
    }
}

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(i) = slot(signal) else { return };
    // Relaxed: a count; each monitor prints whatever it sees then.
    RECEIVED[i].fetch_add(1, Ordering::Relaxed);
    // Acquire: pairs with the Release store in `register`, made before our
    // handler was installed, so the address read is the saved one.
    let chain = CHAIN[i].load(Ordering::Acquire);
    if chain == 0 {
        return;
    }
    if CHAIN_SIGINFO[i].load(Ordering::Relaxed) {
        // SAFETY: `chain` is the `sa_sigaction` of the action we replaced,
        // which had `SA_SIGINFO`: a function of this signature, called with
        // the arguments the kernel gave us.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute::<usize, _>(chain) };
        f(signal, info, context);
    } else {
        // SAFETY: `chain` is the `sa_handler` of the action we replaced
        // (neither `SIG_DFL` nor `SIG_IGN`): a one-argument handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute::<usize, _>(chain) };
        f(signal);
    }
}

/// One runtime's registration for its dump signal (none when it has no
/// dump signal) and its view of the count: has the signal come since its
/// last look? Dropping it ends the registration (the monitor owns it, so
/// that is when the monitor thread exits).
pub(crate) struct DumpRequests {
    slot: Option<usize>,
    seen: u64,
}

impl DumpRequests {
    /// Register for `signal` (installing the handler for the first
    /// registration of that signal). The configuration allows only
    /// `SIGUSR1` and `SIGUSR2`; any other gives a registration for nothing.
    pub(crate) fn register(signal: Option<libc::c_int>) -> DumpRequests {
        let slot = signal.and_then(slot);
        if let (Some(i), Some(signal)) = (slot, signal) {
            let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
            if installed[i].0 == 0 {
                // SAFETY: a zeroed `sigaction` is a valid empty value; the
                // old action is written by the kernel before we read it.
                let previous = unsafe {
                    let mut previous: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(signal, std::ptr::null(), &mut previous);
                    previous
                };
                let handler = previous.sa_sigaction;
                // Our own handler is never chained to itself: that would
                // make one signal recurse until the stack overflows.
                let ours = on_signal as *const () as libc::sighandler_t;
                let chain = if handler == libc::SIG_DFL || handler == libc::SIG_IGN || handler == ours {
                    0
                } else {
                    handler
                };
                CHAIN_SIGINFO[i].store(previous.sa_flags & libc::SA_SIGINFO != 0, Ordering::Relaxed);
                // Release: pairs with the Acquire in `on_signal`.
                CHAIN[i].store(chain, Ordering::Release);
                // SAFETY: as above; the handler only does an atomic add and
                // calls the handler that was installed before it.
                unsafe {
                    let mut action: libc::sigaction = std::mem::zeroed();
                    action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                    // SA_ONSTACK: the signal can land on a fiber near the
                    // end of its small stack; the frame goes on the
                    // thread's alternate signal stack (std gives each
                    // thread one), as the guard-page handler's does.
                    action.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO | libc::SA_ONSTACK;
                    libc::sigemptyset(&mut action.sa_mask);
                    libc::sigaction(signal, &action, std::ptr::null_mut());
                }
                installed[i].1 = Some(previous);
            }
            installed[i].0 += 1;
        }
        DumpRequests {
            slot,
            // Relaxed: see `on_signal`.
            seen: slot.map_or(0, |i| RECEIVED[i].load(Ordering::Relaxed)),
        }
    }

    /// Did the signal come since the last call (or since `register`)?
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

impl Drop for DumpRequests {
    fn drop(&mut self) {
        let Some(i) = self.slot else { return };
        let signal = if i == 0 { libc::SIGUSR1 } else { libc::SIGUSR2 };
        let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
        installed[i].0 -= 1;
        if installed[i].0 == 0 {
            if let Some(previous) = installed[i].1.take() {
                // SAFETY: a zeroed `sigaction` is a valid empty value, and
                // `previous` is the action the kernel gave back when ours
                // was installed: valid to install again. If someone else
                // replaced ours meanwhile, theirs stays.
                unsafe {
                    let mut current: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(signal, std::ptr::null(), &mut current);
                    if current.sa_sigaction == on_signal as *const () as libc::sighandler_t {
                        libc::sigaction(signal, &previous, std::ptr::null_mut());
                    }
                }
            }
            // Relaxed: our handler is no longer installed; a handler run
            // still under way reads either value, both valid.
            CHAIN[i].store(0, Ordering::Relaxed);
        }
    }
}
