//! Loom models of the channel protocol (`cargo xtask loom`).

mod loom_chan;
mod loom_ring_stamps;
