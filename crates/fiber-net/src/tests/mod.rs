#[cfg(loom)]
mod loom_readiness;
#[cfg(loom)]
mod loom_rest;

#[cfg(not(loom))]
mod accept_pending;
#[cfg(not(loom))]
mod readiness;
