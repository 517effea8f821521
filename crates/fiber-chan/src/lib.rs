//! Channels for fibers and threads (not built yet): rendezvous-first bounded
//! and unbounded MPMC channels with exact close semantics and `select!`,
//! parking through fiber-core's `fiber_wait` / `fiber_wake` only.
