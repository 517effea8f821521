#[cfg(loom)]
mod loom_readiness;

#[cfg(not(loom))]
mod readiness;
