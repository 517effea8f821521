//! The fiber dump: every live fiber of a runtime, what it does, since when,
//! and the user's call that parked it (Go's goroutine dump, for fibers).
//!
//! Cheap enough to keep always on: a park records its call site (a
//! `&'static Location`, passed by `#[track_caller]` through the public
//! parking APIs), its [`WaitKind`] and a coarse timestamp (a process-wide
//! millisecond tick that schedulers advance; no clock read per park), all
//! in relaxed atomics of the fiber's frame.

pub use crate::kind::WaitKind;
use crate::state::FiberState;
use std::collections::BTreeMap;
use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds since the process epoch, as last advanced. Padded: every
/// worker reads it on each look for work, and a static written on hot
/// paths next to it would make each read a miss.
static TICK: crossbeam_utils::CachePadded<AtomicU64> = crossbeam_utils::CachePadded::new(AtomicU64::new(0));

/// Advance the coarse clock that parks are stamped with. Schedulers call
/// this from a thread that wakes regularly (fiber-sched's monitor).
pub fn advance_coarse_clock() {
    let ms = epoch().elapsed().as_millis() as u64;
    // Relaxed: a diagnostic timestamp, never used for ordering.
    TICK.fetch_max(ms, Ordering::Relaxed);
}

/// The coarse clock now (milliseconds since the process epoch).
#[inline]
pub(crate) fn coarse_now() -> u64 {
    TICK.load(Ordering::Relaxed)
}

/// The coarse clock as last advanced ([`advance_coarse_clock`]):
/// milliseconds since the process epoch, one plain load. For decisions
/// that need a time bound but not a clock read on every call (a worker's
/// fairness looks).
#[inline]
pub fn coarse_clock_ms() -> u64 {
    coarse_now()
}

/// One live fiber in a [`Dump`].
#[derive(Clone, Debug)]
pub struct FiberInfo {
    /// Its id.
    pub id: crate::FiberId,
    /// Its name, if it was spawned with one.
    pub name: Option<std::sync::Arc<str>>,
    /// Its state now.
    pub state: FiberState,
    /// What it waits for (parked fibers).
    pub waiting: WaitKind,
    /// How long it has been parked (coarse; zero when unknown or running).
    pub since: Duration,
    /// The user's call that parked it (parked fibers).
    pub parked_at: Option<&'static Location<'static>>,
    /// What exactly it waits on, when the waitable says (a socket's
    /// operation and addresses).
    pub on: Option<crate::WaitOn>,
    /// A backtrace of the park, when park backtraces are on
    /// (`FIBER_BACKTRACE=1`, [`crate::set_park_backtraces`]).
    pub backtrace: Option<std::sync::Arc<std::backtrace::Backtrace>>,
    /// Where it was spawned.
    pub spawned_at: &'static Location<'static>,
}

/// Every live fiber of a runtime at one instant (a racy snapshot).
/// `Display` prints it like Go's goroutine dump, grouping fibers that wait
/// in the same way at the same call site.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    /// The fibers, in id order.
    pub fibers: Vec<FiberInfo>,
}

impl Dump {
    pub(crate) fn new(mut fibers: Vec<FiberInfo>) -> Dump {
        fibers.sort_by_key(|f| f.id);
        Dump { fibers }
    }
}

fn state_name(state: FiberState) -> &'static str {
    match state {
        FiberState::Runnable => "runnable",
        FiberState::Running | FiberState::Parking => "running",
        FiberState::Parked | FiberState::Waking => "parked",
        FiberState::Init => "starting",
        FiberState::Done => "done",
        FiberState::Cancelled => "cancelled",
    }
}

impl fmt::Display for Dump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "fiber dump: {} live fiber(s)", self.fibers.len())?;
        type Key = (&'static str, WaitKind, Option<&'static str>, Option<String>, String);
        let mut groups: BTreeMap<Key, Vec<&FiberInfo>> = BTreeMap::new();
        for fiber in &self.fibers {
            let key = (
                state_name(fiber.state),
                fiber.waiting,
                fiber.on.as_ref().map(|on| on.op),
                fiber.parked_at.map(|l| l.to_string()),
                fiber.spawned_at.to_string(),
            );
            groups.entry(key).or_default().push(fiber);
        }
        for ((state, waiting, op, parked_at, spawned_at), fibers) in groups {
            let longest = fibers.iter().map(|f| f.since).max().unwrap_or_default();
            write!(f, "\n{} fiber(s) {state}", fibers.len())?;
            if state == "parked" {
                write!(f, " on {waiting}")?;
                if let Some(op) = op {
                    write!(f, " ({op})")?;
                }
                if let Some(at) = parked_at {
                    write!(f, " at {at}")?;
                }
                if !longest.is_zero() {
                    write!(f, " (up to {:.1} s)", longest.as_secs_f64())?;
                }
            }
            writeln!(f, ", spawned at {spawned_at}:")?;
            let shown = fibers.len().min(16);
            let mut names: Vec<String> = fibers[..shown]
                .iter()
                .map(|fb| {
                    let mut text = match &fb.name {
                        Some(name) => format!("{} {name:?}", fb.id),
                        None => fb.id.to_string(),
                    };
                    if let Some(on) = &fb.on {
                        text.push_str(&format!(" [{}]", on.resource));
                    }
                    text
                })
                .collect();
            if fibers.len() > shown {
                names.push(format!("... and {} more", fibers.len() - shown));
            }
            writeln!(f, "    {}", names.join(", "))?;
            for fb in &fibers[..shown] {
                if let Some(backtrace) = &fb.backtrace {
                    writeln!(f, "    fiber {} parked here:", fb.id)?;
                    for line in backtrace.to_string().lines() {
                        writeln!(f, "      {line}")?;
                    }
                }
            }
        }
        Ok(())
    }
}
