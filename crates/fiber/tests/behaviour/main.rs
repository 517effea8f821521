//! The fiber crate's behaviour tests: the normative MUSTs of the design
//! documents (`musts_000`, `musts_002`), soundness, scheduling, timers,
//! cancellation and the facade's API, one module per file, in one test
//! binary. A test that needs a process of its own runs in a child
//! (`common::in_child`, which finds the module-qualified name).

#[path = "../common/mod.rs"]
mod common;

mod blocking_pool;
mod cancellation;
mod coop_budget;
mod facade_api;
mod facade_std_style;
mod musts_000;
mod musts_002;
mod net_io_park;
mod non_cancellable;
mod reexports;
mod scheduler;
mod soundness;
mod sync_reexport;
mod timers;
mod try_scope_errors;
