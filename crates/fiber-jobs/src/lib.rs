//! Structured concurrency for fibers (not built yet): a job tree, scopes,
//! cancellation, supervisors, deferred results and timeouts, built on
//! fiber-core's contract only.
