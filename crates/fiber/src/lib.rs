//! `fiber`: stackful M:N fibers for Rust (the facade users depend on).
//!
//! The facade re-exports the layers once they exist. Today only the core is
//! built: see [`core`] (fiber-core) for the state machine, the park/wake
//! protocol and a deterministic test scheduler.

#![deny(missing_docs)]

pub use fiber_core as core;
