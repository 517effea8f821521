//! The adversarial programs (misuse, races, shutdown and teardown edges), one
//! module per theme, in one test binary (one link instead of one per
//! file). A test that needs a process of its own runs in a child
//! (`common::in_child`, which finds the module-qualified name).

#[path = "../common/mod.rs"]
mod common;

mod big_values;
mod cancel_in_flight;
mod cancelled_polling;
mod chan_edges;
mod chan_reserved;
mod condvar_edges;
mod deep_trees;
mod drops;
mod dump;
mod edges;
mod fiber_locals;
mod handle_current;
mod handles;
mod id_order;
mod inherited_deadlines;
mod job_joiners;
mod job_outcomes;
mod layer_panics;
mod misuse;
mod net_edges;
mod net_shutdown_wakes;
mod net_unix_backlog;
mod net_unix_short_read;
mod net_unix_shutdown;
mod net_waiters;
mod panic_payloads;
mod pinned_soundness;
mod polling_loops;
mod pool;
mod roots;
mod scope_failures;
mod select;
mod select_senders;
mod select_values;
mod semantics;
mod shutdown;
mod shutdown_blocking;
mod shutdown_jobs;
mod shutdown_panicking_owner;
mod shutdown_stuck;
mod spin;
mod starvation;
mod sync_net;
mod sync_waiters;
mod teardown_destructors;
mod thread_exit;
mod thread_park_token;
mod timeouts;
mod timers;
mod unwind_park;
mod unwinding_polls;
mod yield_loops;
mod zero_waits;
