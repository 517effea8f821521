//! The fiber scheduler (not built yet): work-stealing workers with a global
//! injection queue, an elastic pool from 1x to 2x cores, timers and runtime
//! diagnostics, implementing fiber-core's `Schedule` / `Worker` contract.
//!
//! Until it lands, fiber-core's `testing::TestScheduler` is the only
//! scheduler.
