//! Loom models of the job protocol (`cargo xtask loom`).

mod loom_jobs;
