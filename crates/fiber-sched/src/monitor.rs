//! The monitor thread: timers, pressure sampling, the elastic pool's growth
//! decisions, stall and deadlock reports. Advisory and bounded: each tick
//! does at most one timer batch and one pass over the worker slots.
//!
//! # Growth (spec 7, seed 001)
//!
//! Each [`TICK`] the monitor samples `pressure` (runnable fibers enqueued
//! minus dequeued) and each worker's heartbeat. A worker is *stuck* when it
//! has been running one fiber with no heartbeat progress for
//! [`STUCK_AFTER`]. Growth happens only when runnable work is waiting
//! (pressure > 0), no worker sleeps (else one is woken instead), some worker
//! is stuck, the pool is below its ceiling, and the growth interval has passed
//! since the last growth. It adds one worker; the interval starts at [`SCALE_COOLDOWN`] and doubles with each growth that follows within [`SCALE_BACKOFF_RESET`] (seed 003 backoff).
//! Shrinking happens only when an extra worker has slept for the idle timeout
//! (`worker.rs`), which is far longer than the cooldown: together these are
//! the hysteresis that keeps the pool from oscillating.

use crate::config::STALL_THRESHOLD;
use crate::sync::{lock, Ordering};
use crate::worker::{pressure, spawn_worker, Shared, ACTIVE, DEAD, DRAINING};
use fiber_core::Runnable;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Monitor period while anything is happening.
pub const TICK: Duration = Duration::from_micros(250);
/// Longest monitor period while the runtime is busy: the period doubles
/// from [`TICK`] at each busy tick on which the monitor had nothing to do
/// (no timer fired, no stuck worker, no growth, no stranded work), and is
/// back to [`TICK`] as soon as it acts. Under a steady load the monitor
/// then wakes 500 times a second instead of 4,000 (each wake can preempt a
/// worker on a small machine), while a stall is still seen within
/// [`STUCK_AFTER`] plus this; timer deadlines bound every sleep anyway.
pub const BUSY_TICK_MAX: Duration = Duration::from_millis(2);
/// Monitor period when the runtime is idle (no fiber runnable or running).
pub const IDLE_TICK: Duration = Duration::from_millis(10);
/// No heartbeat progress for this long while running a fiber = stuck. Go's
/// scheduler preempts a goroutine after the same 10 ms; shorter thresholds
/// made the pool grow under ordinary CPU-bound fibers (a 128 KiB DEFLATE
/// block takes about 4 ms here) and oversubscribe the cores.
pub const STUCK_AFTER: Duration = Duration::from_millis(10);
/// Minimum time between two growth events (seed 003's `SCALE_INTERVAL`):
/// each growth adds one worker, and each growth that follows the previous
/// one within [`SCALE_BACKOFF_RESET`] doubles the interval, up to
/// [`SCALE_COOLDOWN_MAX`].
pub const SCALE_COOLDOWN: Duration = Duration::from_millis(10);
/// Ceiling of the growth interval's backoff.
pub const SCALE_COOLDOWN_MAX: Duration = Duration::from_millis(320);
/// Growth-free time after which the interval is back to [`SCALE_COOLDOWN`].
pub const SCALE_BACKOFF_RESET: Duration = Duration::from_secs(1);
/// Consecutive negative pressure samples that debug builds treat as an
/// accounting bug (about 5 s of busy ticks; seed 000 §7.1).
const NEGATIVE_STREAK_LIMIT: u64 = 20_000;
/// Quiet time (everything asleep, root fiber parked, no timer) before a
/// deadlock report.
pub const DEADLOCK_AFTER: Duration = Duration::from_secs(1);

struct WorkerView {
    heartbeat: u64,
    since: Instant,
    stall_reported_for: u64,
    /// The worker's `stolen_from` at the previous scan.
    stolen_from: u64,
    /// When a scan last saw `stolen_from` move.
    taken_at: Instant,
}

std::thread_local! {
    /// On a runtime's monitor thread: that runtime's id (0 on any other
    /// thread).
    static MONITOR_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Is the current thread runtime `shared_id`'s monitor (a tracing layer
/// called for one of its events)? A shutdown cannot join the thread it
/// runs on.
pub(crate) fn thread_of(shared_id: usize) -> bool {
    MONITOR_OF.try_with(|id| id.get() == shared_id).unwrap_or(false)
}

/// How often the monitor looks at the pool's idle frames.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

pub(crate) fn monitor_main(shared: Arc<Shared>, mut dump_requests: crate::dumpsig::DumpRequests) {
    MONITOR_OF.with(|id| id.set(shared.id));
    let mut views: Vec<WorkerView> = (0..shared.slots.len())
        .map(|_| WorkerView {
            heartbeat: 0,
            since: Instant::now(),
            stall_reported_for: 0,
            stolen_from: 0,
            taken_at: Instant::now(),
        })
        .collect();
    let mut last_growth: Option<(Instant, Duration)> = None;
    let mut last_restore: Option<Instant> = None;
    let mut neg_streak = 0u64;
    let mut quiet_since: Option<Instant> = None;
    let mut deadlock_reported = false;
    let mut last_parks = 0u64;
    let mut trim_check = Instant::now();
    let mut idle_low = usize::MAX;
    let mut idle_stacks_low = usize::MAX;
    let mut idle_big_low = usize::MAX;
    let mut busy_tick = TICK;
    loop {
        if shared.is_shutdown() {
            return;
        }
        let now = Instant::now();
        fiber_core::advance_coarse_clock();
        // Awake: armers need not unpark us until we plan the next sleep.
        shared.timers.monitor_awake();
        let fired = shared.fire_timers_from_monitor(now);
        // Give back the memory of the frames and stacks that stayed idle
        // for a whole interval: the lowest idle counts seen on this loop's
        // ticks (at most `IDLE_TICK` apart) since the last check. A pool
        // whose bursts come back within the interval keeps the frames and
        // stacks they take.
        idle_low = idle_low.min(shared.pool.idle_in_global());
        idle_stacks_low = idle_stacks_low.min(shared.pool.idle_stacks_in_global());
        idle_big_low = idle_big_low.min(shared.pool.idle_big_stacks());
        if now.duration_since(trim_check) >= TRIM_INTERVAL {
            trim_check = now;
            let surplus = idle_low.saturating_sub(fiber_core::IDLE_WATERMARK);
            let stack_surplus = idle_stacks_low.saturating_sub(fiber_core::IDLE_WATERMARK);
            // Big stacks (a spawn's `stack_size` above the pool's) idle
            // for the whole interval are all unmapped: no watermark.
            let big_surplus = idle_big_low;
            if surplus > 0 || stack_surplus > 0 || big_surplus > 0 {
                shared.pool.trim_surplus(surplus, stack_surplus, big_surplus);
            }
            idle_low = usize::MAX;
            idle_stacks_low = usize::MAX;
            idle_big_low = usize::MAX;
            // Join blocks idle since the last check go back too.
            fiber_core::trim_join_blocks();
            // Dead timer entries (waits that ended early) of big wheels go
            // once a second, not only when a wheel doubles.
            shared.timers.purge_dead(crate::timer::PURGE_FLOOR);
        }
        if dump_requests.take() {
            eprintln!("{}", shared.pool.dump());
        }
        let pressure = pressure(&shared);
        sample_pressure(&shared, pressure, &mut neg_streak);
        restore_minimum(&shared, now, &mut last_restore);
        let stuck = scan_workers(&shared, &mut views, now);
        let grown_before = last_growth;
        let (busy, rescued) = decide_growth(&shared, pressure, &stuck, now, &mut last_growth);
        check_deadlock(
            &shared,
            busy,
            now,
            &mut quiet_since,
            &mut deadlock_reported,
            &mut last_parks,
        );
        let acted = fired > 0 || !stuck.is_empty() || rescued || last_growth != grown_before;
        busy_tick = if acted || !busy {
            TICK
        } else {
            (busy_tick * 2).min(BUSY_TICK_MAX)
        };
        let mut sleep = if busy { busy_tick } else { IDLE_TICK };
        // Plan the wake-up with the timers (the monitor's half of the
        // handshake in `timer.rs`): no later than any wheel's deadline
        // (a worker's plus the grace its owner has to fire it).
        let now = Instant::now();
        let planned = shared.timers.tick_of(now + sleep);
        let wake = shared.timers.plan_monitor_sleep(planned);
        if wake < planned {
            sleep = sleep.min(shared.timers.instant_of(wake).saturating_duration_since(now));
        }
        if !sleep.is_zero() {
            std::thread::park_timeout(sleep);
        }
    }
}

fn sample_pressure(shared: &Shared, pressure: i64, neg_streak: &mut u64) {
    let counters = &shared.counters;
    counters.current_pressure.store(pressure, Ordering::Relaxed);
    if pressure > 0 {
        counters.positive_samples.fetch_add(1, Ordering::Relaxed);
    }
    if pressure < 0 {
        counters.negative_samples.fetch_add(1, Ordering::Relaxed);
        *neg_streak += 1;
        counters.neg_streak_max.fetch_max(*neg_streak, Ordering::Relaxed);
        debug_assert!(
            *neg_streak < NEGATIVE_STREAK_LIMIT,
            "pressure has stayed negative for {} samples: enqueue/dequeue accounting is off",
            *neg_streak
        );
    } else {
        *neg_streak = 0;
    }
}

/// At most this many fibers of a stuck worker's main deque move to the
/// global queue per scan (see `scan_workers`): enough for fairness (a
/// busy worker takes `GLOBAL_BATCH` of them every `GLOBAL_CHECK_INTERVAL`
/// turns), and a bounded cost for the monitor when the backlog is large.
const RESCUE_BATCH: usize = 64;

/// Move a stuck worker's runnext, inbox and deques to the global queue
/// (pinned fibers homed there go back to its inbox). Returns how many
/// moved. The deques too (at most `main_limit` fibers of the deque of
/// spawned and woken fibers, the oldest first): thieves take from them only
/// when their own queues are empty, so with growth off a fiber left in the
/// deque of a worker stuck in one long computation waited for it to end
/// while the other worker ran a busy ping-pong pair.
fn rescue_waiting(shared: &Shared, index: usize, main_limit: usize) -> usize {
    let slot = &shared.slots[index];
    let mut moved = 0;
    let mut keep = Vec::new();
    let mut divert = |fiber: Runnable| {
        if fiber.home() == Some(index) {
            keep.push(fiber);
        } else {
            shared.global.push(fiber);
            moved += 1;
        }
    };
    while let Some(fiber) = slot.inbox.pop() {
        divert(fiber);
    }
    // The main deque is LIFO: the worker pops its newest fiber first, and
    // a steal takes the oldest. Its fibers go to the global queue in the
    // worker's own order (the order of the stolen ones reversed): a batch
    // the worker took from the global queue (pushed so that it pops in the
    // global queue's order) goes back in that order. Moved oldest first,
    // each rescue reversed the batch, and beside fibers that yield after
    // turns longer than the stuck threshold the fibers in its middle swapped
    // places at every rescue and never ran (a timer-woken fiber waited for
    // ever: `reviews/review34.rs::a_sleeper_beside_five_yielding_crunchers_two_workers`).
    let mut main = Vec::new();
    while main.len() < main_limit {
        match slot.stealer.steal() {
            crossbeam_deque::Steal::Success(fiber) => main.push(fiber),
            crossbeam_deque::Steal::Retry => continue,
            crossbeam_deque::Steal::Empty => break,
        }
    }
    for fiber in main.into_iter().rev() {
        divert(fiber);
    }
    // The yield deque is FIFO: a steal takes the fiber the worker would
    // run next.
    loop {
        match slot.yield_stealer.steal() {
            crossbeam_deque::Steal::Success(fiber) => divert(fiber),
            crossbeam_deque::Steal::Retry => continue,
            crossbeam_deque::Steal::Empty => break,
        }
    }
    // The runnext fiber last: it is the newest. (First, it went ahead of
    // the fibers a busy worker had batched from the global queue into its
    // deque; its next fair look took it and batched the rest back into the
    // deque, which the next rescue moved behind the new runnext fiber
    // again: a timer-woken fiber went round that loop for 24 s beside a
    // ping-pong pair computing 25 ms a turn, on a loaded machine.)
    if let Some(fiber) = slot.runnext.take() {
        divert(fiber);
    }
    for fiber in keep {
        slot.inbox.push(fiber);
    }
    moved
}

/// Move every fiber in worker `index`'s deques to the global queue.
fn steal_all(shared: &Shared, index: usize) -> usize {
    let slot = &shared.slots[index];
    let mut moved = 0;
    for stealer in [&slot.stealer, &slot.yield_stealer] {
        loop {
            match stealer.steal() {
                crossbeam_deque::Steal::Success(fiber) => {
                    shared.global.push(fiber);
                    moved += 1;
                }
                crossbeam_deque::Steal::Retry => continue,
                crossbeam_deque::Steal::Empty => break,
            }
        }
    }
    moved
}

/// Start a worker in the first DEAD slot that takes one; its index, or
/// `None` if no thread could be started (or no slot is free).
fn start_in_a_dead_slot(shared: &Arc<Shared>) -> Option<usize> {
    (0..shared.slots.len()).find(|&i| shared.slots[i].state.load(Ordering::Relaxed) == DEAD && spawn_worker(shared, i))
}

/// The pool is below its minimum (`workers`): a worker thread could not
/// be started when one was needed (a failed replacement, a failed start
/// after an `on_thread_start` panic). Try again, at most once per
/// `RESTORE_EVERY`, so that the runtime gets its workers back once
/// threads can be created again.
fn restore_minimum(shared: &Arc<Shared>, now: Instant, last_try: &mut Option<Instant>) {
    if shared.alive.load(Ordering::Relaxed) >= shared.config.workers
        || last_try.is_some_and(|at| now.duration_since(at) < RESTORE_EVERY)
    {
        return;
    }
    *last_try = Some(now);
    while shared.alive.load(Ordering::Relaxed) < shared.config.workers {
        match start_in_a_dead_slot(shared) {
            Some(i) => shared
                .counters
                .record_grow(format!("+1 worker (slot {i}): the pool was below its minimum")),
            None => return,
        }
    }
    shared.notify_one();
}

/// How often the monitor retries starting workers the pool is missing.
const RESTORE_EVERY: Duration = Duration::from_millis(100);

/// Seed 000 §6.2: a worker that made no progress (one fiber without a
/// yield point) for the retire interval goes DRAINING: it accepts no new
/// work, what waits on it moves to the global queue, and it exits as soon
/// as its fiber gives the thread back. A replacement starts at once if the
/// pool is below its ceiling, so the pool keeps its capacity; at the
/// ceiling it drains only if at least `workers` others stay (or a growth-off
/// runtime would lose its worker for good). Workers
/// that are home to pinned fibers are exempt (those fibers resume only
/// there).
fn drain_stuck(shared: &Arc<Shared>, index: usize, running: u64, still: Duration) {
    let slot = &shared.slots[index];
    // A drained worker exits when its fiber returns. At the ceiling no
    // replacement can start, so drain only if the workers that stay are
    // still at least `workers`: with growth off (`max_workers == workers`)
    // draining left the runtime with no worker at all, for good. A stuck
    // worker stays then (its waiting fibers are still rescued each scan).
    let can_replace = shared.alive.load(Ordering::Relaxed) < shared.config.max_workers;
    let enough_stay = shared.staying.load(Ordering::Relaxed) > shared.config.workers;
    if !can_replace && !enough_stay {
        return;
    }
    // When the workers that stay would fall below `workers`, the
    // replacement must start first: a thread that cannot be created (no
    // memory, a thread cap) left the pool with no worker at all, for good.
    let started_first = if enough_stay {
        None
    } else {
        match start_in_a_dead_slot(shared) {
            Some(i) => Some(i),
            None => {
                shared.counters.record_shrink(format!(
                    "worker {index} stays: fiber {running} made no progress for {still:?}, but no \
                     replacement thread could be started"
                ));
                return;
            }
        }
    };
    // Relaxed CAS: the state word is advisory for placement here; the
    // worker's exit path fences before it drains (as for retirement).
    // The caller's check that no fiber is bound to the worker (`homed`)
    // came before and is not repeated: a pinned fiber's first run can fall
    // between. The worker then finds the count above zero at its slice's
    // end and takes up its work again (`run_loop`), and the bound fibers'
    // wakes wait in its inbox meanwhile (`Shared::push_inbox`).
    if slot
        .state
        .compare_exchange(ACTIVE, DRAINING, Ordering::Relaxed, Ordering::Relaxed)
        .is_err()
    {
        if let Some(i) = started_first {
            // The worker moved on meanwhile: the one started stays, a
            // growth like any other (idle, it retires as usual).
            shared.counters.record_grow(format!(
                "+1 worker (slot {i}): to replace worker {index}, which moved on"
            ));
        }
        return;
    }
    // It no longer counts toward the minimum (it is leaving).
    shared.staying.fetch_sub(1, Ordering::Relaxed);
    shared.counters.drained_stuck.fetch_add(1, Ordering::Relaxed);
    let moved = rescue_waiting(shared, index, usize::MAX) + steal_all(shared, index);
    let at_ceiling = shared.alive.load(Ordering::Relaxed) >= shared.config.max_workers;
    let replacement = match started_first {
        Some(i) => Some(i),
        None if !at_ceiling => start_in_a_dead_slot(shared),
        None => None,
    };
    shared.counters.record_shrink(format!(
        "worker {index} draining: fiber {running} made no progress for {still:?} (retire interval {:?}); \
         {moved} fiber(s) moved to the global queue; replacement: {}",
        shared.config.idle_timeout,
        match replacement {
            Some(i) => format!("slot {i}"),
            None if at_ceiling => "none (at the ceiling)".to_string(),
            None => "none (no thread could be started)".to_string(),
        }
    ));
    if let Some(i) = replacement {
        // A worker started: a scale-up like any growth, so that scale-ups
        // minus scale-downs is the pool's size over its minimum.
        shared
            .counters
            .record_grow(format!("+1 worker (slot {i}): replaces draining worker {index}"));
    }
    if moved > 0 {
        shared.notify_one();
    }
}

/// Update heartbeat views; return the stuck workers. Also the stall report.
fn scan_workers(shared: &Arc<Shared>, views: &mut [WorkerView], now: Instant) -> Vec<usize> {
    let mut stuck = Vec::new();
    for (index, (slot, view)) in shared.slots.iter().zip(views.iter_mut()).enumerate() {
        let state = slot.state.load(Ordering::Relaxed);
        if state == DRAINING && slot.running.load(Ordering::Relaxed) != 0 {
            // Drained for no progress and still in its fiber: what the
            // fiber spawns or wakes meanwhile must not wait for it.
            if rescue_waiting(shared, index, usize::MAX) + steal_all(shared, index) > 0 {
                shared.notify_one();
            }
            // Its fiber still blocks a thread: the stall report is due as
            // on an active worker (a drained worker was skipped, so a small
            // idle timeout silenced every stall report).
            let beat = slot.heartbeat.load(Ordering::Relaxed);
            let running = slot.running.load(Ordering::Relaxed);
            if beat != view.heartbeat {
                view.heartbeat = beat;
                view.since = now;
                view.stall_reported_for = 0;
            } else {
                report_stall(shared, index, view, running, now.duration_since(view.since));
            }
            continue;
        }
        if state != ACTIVE {
            view.since = now;
            continue;
        }
        let beat = slot.heartbeat.load(Ordering::Relaxed);
        let running = slot.running.load(Ordering::Relaxed);
        let stolen_from = slot.stolen_from.load(Ordering::Relaxed);
        if stolen_from != view.stolen_from {
            view.stolen_from = stolen_from;
            view.taken_at = now;
        }
        if beat != view.heartbeat || running == 0 {
            view.heartbeat = beat;
            view.since = now;
            // The worker moved on: a later stall, even of the same fiber,
            // is a new one (reported again).
            view.stall_reported_for = 0;
            if slot.stalled.load(Ordering::Relaxed) {
                slot.stalled.store(false, Ordering::Relaxed);
            }
            continue;
        }
        let still = now.duration_since(view.since);
        if still >= STUCK_AFTER {
            // The worker runs one fiber without a yield point (or blocks):
            // what waits only for it (its runnext slot and its inbox, which
            // other workers do not steal from) moves to the global queue,
            // so no runnable fiber stays invisible for longer than this
            // threshold. Pinned fibers homed here stay.
            // Its deques too; from the main one at most `RESCUE_BATCH`
            // fibers a scan (its oldest), and only if no other worker took
            // from it for the stuck threshold and the global queue is
            // empty.
            // While thieves take from it (the oldest first), what waits
            // there is being run: a spawner that never yields while the
            // other workers run its children. While the global queue holds
            // fibers (an earlier rescue), the others are busy with those and
            // every worker looks there at least every `GLOBAL_CHECK_INTERVAL` turns;
            // the rest moves once it has drained. Moving the whole deque to
            // the global queue every tick instead cost W6 about 15% of its
            // CPU time (a third thread's steals and pushes, and the workers
            // eating from the global queue instead of stealing batches).
            // The yield deque is stolen from only once the main one is
            // empty, so it is always rescued.
            let untouched = now.saturating_duration_since(view.taken_at) >= STUCK_AFTER;
            let limit = if untouched && shared.global.is_empty() {
                RESCUE_BATCH
            } else {
                0
            };
            let moved = rescue_waiting(shared, index, limit);
            if moved > 0 {
                shared.notify_one();
            }
            if !slot.blocking.load(Ordering::Relaxed) {
                stuck.push(index);
                slot.stalled.store(true, Ordering::Relaxed);
            }
        }
        if still >= shared.config.idle_timeout && slot.homed.load(Ordering::Relaxed) == 0 {
            drain_stuck(shared, index, running, still);
        }
        report_stall(shared, index, view, running, still);
    }
    stuck
}

/// The stall report for worker `index`, still in fiber `running` for
/// `still`: once per stall (the view forgets it when the worker moves on),
/// draining workers included.
fn report_stall(shared: &Shared, index: usize, view: &mut WorkerView, running: u64, still: Duration) {
    let slot = &shared.slots[index];
    if still >= STALL_THRESHOLD && shared.config.stall_report && view.stall_reported_for != running {
        view.stall_reported_for = running;
        shared.counters.stall_reports.fetch_add(1, Ordering::Relaxed);
        let at = slot.running_at.load(Ordering::Relaxed);
        let location = if at.is_null() {
            "an unknown place".to_string()
        } else {
            // SAFETY: `running_at` only ever holds `&'static Location`s.
            unsafe { (*at).to_string() }
        };
        crate::emit("logging a stall", || {
            tracing::warn!(
                target: "fiber_sched",
                fiber = running,
                worker = index,
                spawned_at = %location,
                seconds = still.as_secs_f64(),
                "stall: a fiber runs without a yield point"
            )
        });
        eprintln!(
            "fiber: stall: fiber {running} has been running on worker {index} for {:.1} s without a \
             yield point (spawned at {location}); other fibers on that worker wait. Set \
             FIBER_DEBUG_STALL=0 to silence this report.\n{}",
            still.as_secs_f64(),
            shared.pool.dump()
        );
    }
}

/// The growth gate. Returns whether the runtime is busy, and whether it
/// woke a sleeper for work left unseen (the backstop below).
fn decide_growth(
    shared: &Arc<Shared>,
    pressure: i64,
    stuck: &[usize],
    now: Instant,
    last_growth: &mut Option<(Instant, Duration)>,
) -> (bool, bool) {
    let counters = &shared.counters;
    let alive = shared.alive.load(Ordering::Relaxed);
    let sleeping = shared.idle.sleeping();
    let running_somewhere = shared.slots.iter().any(|s| s.running.load(Ordering::Relaxed) != 0);
    let busy = pressure > 0 || running_somewhere || sleeping < alive;
    if pressure == 0 && shared.global.is_empty() {
        counters.gate_no_work.fetch_add(1, Ordering::Relaxed);
        return (busy, false);
    }
    if pressure <= 0 {
        counters.gate_nonpositive.fetch_add(1, Ordering::Relaxed);
        return (busy, false);
    }
    if sleeping > 0 {
        counters.gate_idle_capacity.fetch_add(1, Ordering::Relaxed);
        // Backstop for a notify a local push skipped: wake a sleeper if
        // there is work it can take (runnext slots cannot be stolen).
        if shared.has_work(None) {
            shared.notify_one();
            return (busy, true);
        }
        return (busy, false);
    }
    if stuck.is_empty() {
        counters.gate_not_stuck.fetch_add(1, Ordering::Relaxed);
        return (busy, false);
    }
    if alive >= shared.config.max_workers {
        counters.gate_at_max.fetch_add(1, Ordering::Relaxed);
        return (busy, false);
    }
    if let Some((at, interval)) = *last_growth {
        if now.duration_since(at) < interval {
            counters.gate_cooldown.fetch_add(1, Ordering::Relaxed);
            return (busy, false);
        }
    }
    counters.gate_passes.fetch_add(1, Ordering::Relaxed);
    // One worker per growth (seed 003's backoff rule).
    let added = (0..shared.slots.len())
        .find(|&index| shared.slots[index].state.load(Ordering::Relaxed) == DEAD && spawn_worker(shared, index));
    if let Some(index) = added {
        let interval = match *last_growth {
            Some((at, interval)) if now.duration_since(at) < SCALE_BACKOFF_RESET => {
                (interval * 2).min(SCALE_COOLDOWN_MAX)
            }
            _ => SCALE_COOLDOWN,
        };
        *last_growth = Some((now, interval));
        counters.record_grow(format!(
            "+1 worker (slot {index}): worker(s) {stuck:?} stuck with {pressure} runnable fiber(s) waiting; \
             next growth not before {interval:?}"
        ));
    }
    (busy, false)
}

/// Will runtime `shared` act again by itself: a fiber running or runnable
/// there, a timer pending, a blocking call in flight? (Another runtime's
/// deadlock report asks: while this one acts, that one's quiet is no
/// deadlock.) A socket wait does not count: an idle server of one runtime
/// parked in `accept` for good must not hide another runtime's deadlock
/// for good (`adversarial/roots.rs::a_deadlock_is_reported_while_another_runtime_waits_on_a_socket`).
pub(crate) fn may_still_act(shared: &Shared) -> bool {
    // Relaxed loads throughout: a snapshot for a report that waits a
    // whole quiet window before it fires, like `check_deadlock`'s own.
    let alive = shared.alive.load(Ordering::Relaxed);
    shared.idle.sleeping() < alive
        || !shared.global.is_empty()
        || shared
            .slots
            .iter()
            .any(|s| s.running.load(Ordering::Relaxed) != 0 || s.blocking.load(Ordering::Relaxed))
        || crate::blocking::in_flight(shared.id) != 0
        // Live timers only, as in `check_deadlock`: dead entries (waits
        // that ended early) wake nobody, and must not hold another
        // runtime's report off until they expire
        // (`reviews/review26.rs::a_real_deadlock_is_reported_while_another_runtime_holds_only_dead_timer_entries`).
        // The sweep runs only when the other runtime's quiet window is up.
        || (shared.timers.any_pending() && shared.timers.purge_dead(1) > 0)
}

/// Go-style "all fibers are asleep" report.
fn check_deadlock(
    shared: &Shared,
    busy: bool,
    now: Instant,
    quiet_since: &mut Option<Instant>,
    reported: &mut bool,
    last_parks: &mut u64,
) {
    let roots = lock(&shared.root_fibers).clone();
    // Progress since the last look: a fiber parked again after running (a
    // root woken by a plain thread every 200 ms runs for microseconds, and
    // a tick seeing the runtime busy would miss it: the quiet window then
    // ran on through such wakes and reported a deadlock, and a report once
    // made was never re-armed for a later real one).
    let parks: u64 = shared.slots.iter().map(|s| s.parks.load(Ordering::Relaxed)).sum();
    let progressed = parks != *last_parks;
    *last_parks = parks;
    let quiet = !busy
        && !progressed
        && !roots.is_empty()
        && shared.global.is_empty()
        && shared.slots.iter().all(|s| !s.blocking.load(Ordering::Relaxed))
        // A fiber waiting for a blocking-pool call may still be woken
        // from outside: not a deadlock. (So may one parked on a socket:
        // looked for below, among this runtime's fibers; the process-wide
        // count of socket waits let another runtime's server hide this
        // one's deadlock.)
        && crate::blocking::in_flight(shared.id) == 0;
    if !quiet {
        *quiet_since = None;
        *reported = false;
        return;
    }
    let since = *quiet_since.get_or_insert(now);
    if *reported || now.duration_since(since) < DEADLOCK_AFTER {
        return;
    }
    // A pending timer may still wake a fiber, but only a live one: an
    // entry left by a wait that ended early (a `recv_timeout(1h)` answered
    // at once) wakes nobody, and must not hide a deadlock for an hour. So
    // the wheels are swept of dead entries first (once per quiet window,
    // not every tick: a sweep is linear in the entries).
    if shared.timers.any_pending() && shared.timers.purge_dead(1) > 0 {
        *quiet_since = Some(now);
        return;
    }
    // A fiber of this runtime waits for a socket: the outside world may
    // still wake it. Checked first, by a scan that stops at the first such
    // fiber and copies nothing: an idle server (every fiber parked, most on
    // sockets) otherwise paid for a full dump of every fiber every second.
    if shared.pool.any_parked_on(fiber_core::WaitKind::Io) {
        *quiet_since = Some(now);
        return;
    }
    // A fiber joining a fiber or a job may wait for another runtime's,
    // which that runtime's timers, sockets or threads may still end: with
    // another runtime running in the process, a join is no deadlock.
    if shared.pool.any_parked_on(fiber_core::WaitKind::Join) && crate::handle::another_runtime_running(shared.id) {
        *quiet_since = Some(now);
        return;
    }
    // Nor is any other wait while another runtime still acts (a fiber
    // running or runnable there, a timer pending, a blocking call): its
    // fibers may send on a channel, release a lock or unpark a fiber of
    // this one (`reviews/review21.rs::a_root_waiting_on_a_channel_fed_by_another_runtime_is_not_a_deadlock`).
    // The report is about the whole process, as Go's is.
    if crate::handle::another_runtime_acting(shared.id) {
        *quiet_since = Some(now);
        return;
    }
    let parked = shared.pool.parked_fibers();
    // A root parked with nothing runnable and nothing pending anywhere is
    // stuck, whatever other roots do (another `block_on` may have
    // returned meanwhile).
    let Some(root) = roots.iter().copied().find(|&r| parked.iter().any(|p| p.id.0 == r)) else {
        return;
    };
    let dump = shared.pool.dump();
    *reported = true;
    shared.counters.deadlock_reports.fetch_add(1, Ordering::Relaxed);
    let mut report = format!(
        "fiber: deadlock: all fibers are asleep: no fiber is runnable, no timer is pending, and the root \
         fiber {root} has been parked for {:?} (if a plain thread or another runtime is about to wake \
         it, ignore this). {} parked fiber(s):\n",
        DEADLOCK_AFTER,
        parked.len()
    );
    crate::emit("logging a deadlock", || {
        tracing::warn!(
            target: "fiber_sched",
            root_fiber = root,
            parked = parked.len(),
            "deadlock: all fibers are asleep"
        )
    });
    report.push_str(&dump.to_string());
    eprint!("{report}");
    if shared.config.deadlock_abort {
        eprintln!("fiber: FIBER_DEADLOCK_ABORT=1: aborting");
        std::process::abort();
    }
}

/// Start the monitor thread.
pub(crate) fn start(
    shared: &Arc<Shared>,
    dump_requests: crate::dumpsig::DumpRequests,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let monitor_shared = shared.clone();
    let handle = std::thread::Builder::new()
        .name(format!("{}-monitor", shared.config.thread_name))
        .spawn(move || monitor_main(monitor_shared, dump_requests))?;
    *lock(&shared.monitor) = Some(handle.thread().clone());
    Ok(handle)
}
