#[cfg(loom)]
mod loom_readiness;
