//! The scheduler on real OS threads.

#[cfg(loom)]
mod loom_idle;

#[cfg(not(loom))]
mod runtime;

#[cfg(not(loom))]
mod blocking;
