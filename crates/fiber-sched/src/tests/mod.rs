//! The scheduler on real OS threads.

#[cfg(loom)]
mod loom_idle;

#[cfg(loom)]
mod loom_timer;

#[cfg(loom)]
mod loom_shutdown;

#[cfg(not(loom))]
mod runtime;

#[cfg(not(loom))]
mod blocking;
