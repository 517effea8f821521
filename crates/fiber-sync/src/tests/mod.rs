//! Loom models of the fiber-sync protocols (`cargo xtask loom fiber-sync`).

mod loom_sync;
