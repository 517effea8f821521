//! Counters (Relaxed: diagnostics only, never used for correctness) and the
//! [`Stats`] snapshot, printed at shutdown with `FIBER_STATS=1`.

use crate::sync::{lock, AtomicU64, Mutex, Ordering};
use std::fmt;

/// Scale events kept with their reasons (older ones are counted only).
const EVENT_LOG: usize = 64;

/// Runtime-wide counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) wakeups: AtomicU64,
    pub(crate) sleeps: AtomicU64,
    pub(crate) inbox_pushes: AtomicU64,
    pub(crate) global_pushes: AtomicU64,
    pub(crate) spawn_failures: AtomicU64,
    pub(crate) external_spawns: AtomicU64,
    pub(crate) scale_ups: AtomicU64,
    pub(crate) scale_downs: AtomicU64,
    pub(crate) gate_no_work: AtomicU64,
    pub(crate) gate_nonpositive: AtomicU64,
    pub(crate) gate_idle_capacity: AtomicU64,
    pub(crate) gate_not_stuck: AtomicU64,
    pub(crate) gate_at_max: AtomicU64,
    pub(crate) gate_cooldown: AtomicU64,
    pub(crate) gate_passes: AtomicU64,
    pub(crate) current_pressure: std::sync::atomic::AtomicI64,
    pub(crate) positive_samples: AtomicU64,
    pub(crate) negative_samples: AtomicU64,
    pub(crate) neg_streak_max: AtomicU64,
    pub(crate) stall_reports: AtomicU64,
    pub(crate) deadlock_reports: AtomicU64,
    /// Workers put in DRAINING for making no progress.
    pub(crate) drained_stuck: AtomicU64,
    /// Worker threads left running at shutdown (stuck in a fiber).
    pub(crate) leaked_threads: AtomicU64,
    pub(crate) events: Mutex<Vec<String>>,
}

impl Counters {
    pub(crate) fn record_grow(&self, reason: String) {
        self.scale_ups.fetch_add(1, Ordering::Relaxed);
        crate::emit(
            "logging a pool growth",
            || tracing::debug!(target: "fiber_sched", reason = %reason, "worker pool grew"),
        );
        self.log(format!("grow: {reason}"));
    }

    pub(crate) fn record_shrink(&self, reason: String) {
        self.scale_downs.fetch_add(1, Ordering::Relaxed);
        crate::emit(
            "logging a pool shrink",
            || tracing::debug!(target: "fiber_sched", reason = %reason, "worker pool shrank"),
        );
        self.log(format!("shrink: {reason}"));
    }

    fn log(&self, event: String) {
        let mut events = lock(&self.events);
        if events.len() < EVENT_LOG {
            events.push(event);
        }
    }
}

/// A snapshot of a runtime's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Worker threads alive now.
    pub workers: usize,
    /// Workers at start (the pool's floor).
    pub min_workers: usize,
    /// The pool's ceiling.
    pub max_workers: usize,
    /// Workers asleep now.
    pub sleeping_workers: usize,
    /// Fibers spawned and not finished. A fiber counts until its frame is
    /// back in the pool, just after it wakes its joiner: right after a
    /// `join` returns (on a plain thread especially) the count may still
    /// include it for a moment.
    pub fibers_alive: usize,
    /// Runnable fibers waiting in queues (the pressure counter, >= 0).
    pub fibers_runnable: usize,
    /// Fibers parked now (alive minus runnable minus running; approximate:
    /// the counters are read one after another, so a fiber on its way
    /// from a queue to its worker may count as parked for a moment). To
    /// wait until given fibers have parked, read their states in
    /// [`Runtime::dump`](crate::Runtime::dump), which reads each fiber's
    /// state word.
    pub fibers_parked: usize,
    /// Fibers spawned.
    pub spawns: u64,
    /// Parks committed.
    pub parks: u64,
    /// Wakes (fibers made runnable by a claim, timers and cancels included).
    pub wakes: u64,
    /// Successful steals.
    pub steals: u64,
    /// Pushes to worker inboxes.
    pub inbox_pushes: u64,
    /// Pushes to the global queue.
    pub global_pushes: u64,
    /// Global pushes that found the ring full and used the overflow list.
    pub global_overflow_pushes: u64,
    /// Worker wake-ups by notifiers.
    pub worker_wakeups: u64,
    /// Times a worker went to sleep.
    pub worker_sleeps: u64,
    /// Pool growth events.
    pub scale_ups: u64,
    /// Pool shrink events (retirements).
    pub scale_downs: u64,
    /// Scale events with their reasons (the first 64).
    pub scale_events: Vec<String>,
    /// Monitor ticks where growth was not considered: no runnable work.
    pub gate_no_work: u64,
    /// ... pressure was not positive.
    pub gate_nonpositive: u64,
    /// ... a sleeping worker could take the work instead (it was woken).
    pub gate_idle_capacity: u64,
    /// ... no worker was stuck.
    pub gate_not_stuck: u64,
    /// ... the pool was at its ceiling.
    pub gate_at_max: u64,
    /// Growth blocked by the rate limit (one worker per scale interval,
    /// with backoff).
    pub gate_cooldown: u64,
    /// Growth decisions that passed every gate (each adds one worker).
    pub gate_passes: u64,
    /// Workers added by growth (promoted to running fibers).
    pub promoted_workers: u64,
    /// Pressure at the last sample: runnable fibers enqueued minus dequeued,
    /// signed (transiently negative under races).
    pub current_pressure: i64,
    /// Pressure samples above zero.
    pub pressure_positive_samples: u64,
    /// Pressure samples below zero.
    pub pressure_negative_samples: u64,
    /// Longest run of consecutive negative pressure samples.
    pub pressure_negative_streak_max: u64,
    /// Timers pending (including ones whose wait already ended).
    pub timers_pending: usize,
    /// Stall reports printed.
    pub stall_reports: u64,
    /// Deadlock reports printed.
    pub deadlock_reports: u64,
    /// Workers put in DRAINING because they made no progress (one fiber
    /// without a yield point) for the retire interval (the idle timeout):
    /// each takes no new work and exits once its fiber gives the thread
    /// back, and a replacement starts if the pool is below its ceiling.
    /// A drain undone (a fiber became bound to the worker in that slice,
    /// so it stays) is not counted.
    pub workers_drained_stuck: u64,
    /// Fiber frames ever allocated.
    pub frames_allocated: usize,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fiber runtime stats")?;
        writeln!(
            f,
            "  workers {} (min {}, max {}), {} asleep",
            self.workers, self.min_workers, self.max_workers, self.sleeping_workers
        )?;
        writeln!(
            f,
            "  fibers: {} alive ({} runnable, {} parked); {} frames allocated",
            self.fibers_alive, self.fibers_runnable, self.fibers_parked, self.frames_allocated
        )?;
        writeln!(
            f,
            "  spawns {}, parks {}, wakes {}, steals {}, inbox pushes {}, global pushes {} ({} to overflow)",
            self.spawns,
            self.parks,
            self.wakes,
            self.steals,
            self.inbox_pushes,
            self.global_pushes,
            self.global_overflow_pushes
        )?;
        writeln!(
            f,
            "  worker wake-ups {}, sleeps {}",
            self.worker_wakeups, self.worker_sleeps
        )?;
        writeln!(f, "  scale-ups {}, scale-downs {}", self.scale_ups, self.scale_downs)?;
        for event in &self.scale_events {
            writeln!(f, "    {event}")?;
        }
        writeln!(
            f,
            "  gate blocks: no_work {}, nonpositive {}, idle_capacity {}, not_stuck {}, at_max {}, cooldown {}",
            self.gate_no_work,
            self.gate_nonpositive,
            self.gate_idle_capacity,
            self.gate_not_stuck,
            self.gate_at_max,
            self.gate_cooldown
        )?;
        writeln!(
            f,
            "  gate passes {}, promoted workers {}, current pressure {}",
            self.gate_passes, self.promoted_workers, self.current_pressure
        )?;
        writeln!(
            f,
            "  pressure samples: {} positive, {} negative; longest negative streak {}",
            self.pressure_positive_samples, self.pressure_negative_samples, self.pressure_negative_streak_max
        )?;
        write!(
            f,
            "  timers pending {}, stall reports {}, deadlock reports {}, workers drained for no progress {}",
            self.timers_pending, self.stall_reports, self.deadlock_reports, self.workers_drained_stuck
        )
    }
}
