//! Extra lines for the runtime's shutdown statistics (`FIBER_STATS=1`):
//! layers above the core (jobs, ...) register a reporter once; the
//! scheduler prints every reporter's line after its own counters, so the
//! shutdown report shows what `fiber::stats()` shows without the scheduler
//! depending on those layers.

use std::sync::Mutex;

static REPORTERS: Mutex<Vec<fn() -> String>> = Mutex::new(Vec::new());

/// Register `reporter` (once per function; later calls with the same
/// function are ignored). Each reporter returns one or more lines, each
/// starting with two spaces, like the scheduler's own lines.
pub fn register_stats_reporter(reporter: fn() -> String) {
    let mut reporters = REPORTERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !reporters.iter().any(|r| std::ptr::fn_addr_eq(*r, reporter)) {
        reporters.push(reporter);
    }
}

/// The lines of every registered reporter, in registration order.
pub fn stats_reports() -> Vec<String> {
    let reporters: Vec<fn() -> String> = REPORTERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    reporters.into_iter().map(|r| r()).collect()
}
