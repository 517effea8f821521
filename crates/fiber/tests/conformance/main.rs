//! The behaviour suites ported from std, crossbeam-channel, Go, Kotlin, may,
//! tokio and trio, one module per source, in one test binary (one link instead of one per
//! file). A test that needs a process of its own runs in a child
//! (`common::in_child`, which finds the module-qualified name).

#[path = "../common/mod.rs"]
mod common;

#[path = "../common/three_ways.rs"]
#[macro_use]
mod three_ways;

mod channels;
mod crossbeam;
mod crossbeam_mpsc;
mod go_chan;
mod go_runtime;
mod go_sync;
mod jobs;
mod kotlin_jobs;
mod may;
mod ported_names;
mod std_net;
mod std_sync;
mod std_thread;
mod std_traits;
mod std_upstream;
mod trio_tokio;
