//! Timers: deadlines of `fiber_wait` and `sleep`.
//!
//! # Layout
//!
//! One hierarchical timing wheel per worker slot, plus one shared wheel for
//! deadlines armed from threads that are not workers of this runtime. A
//! wheel has [`LEVELS`] levels of 64 slots; level `l` slots span `64^l`
//! ticks of [`TICK`] (1 ms), so the wheel covers about 2.1 years ahead of
//! its clock (`HORIZON`); later deadlines wait in a `far` list. Insert and expiry are
//! O(1) per entry (an entry moves down at most `LEVELS - 1` times).
//!
//! A worker inserts into its own wheel only (under that wheel's lock, which
//! nobody else takes unless the owner is busy), so timers never contend on
//! a runtime-wide lock. Deadlines round up to the next tick: a timer never
//! fires early.
//!
//! # Who fires
//!
//! * The owner, at each turn of its loop and before it sleeps; a sleeping
//!   worker sleeps at most until its wheel's next deadline.
//! * Idle (searching) workers fire any due wheel: the fibers woken land on
//!   their own queues.
//! * The monitor fires the shared wheel when due, and a worker's wheel when
//!   it is overdue by [`GRACE`] (its owner is busy in a fiber that does not
//!   yield, or is gone): so a deadline never waits for a spinning fiber.
//!   Fibers the monitor wakes go to the global queue, not to the busy
//!   owner's inbox.
//!
//! # The monitor's sleep (the only cross-thread handshake)
//!
//! The monitor sleeps until a planned instant. A worker that arms a timer
//! earlier than everything its wheel held must make sure the monitor either
//! planned with it or is unparked:
//!
//! * armer: publish the wheel's new `next` (in the wheel lock); `fence(SeqCst)`;
//!   read `monitor_wake`; unpark the monitor if it plans to wake later than
//!   the new deadline (plus grace).
//! * monitor: store `monitor_wake`; `fence(SeqCst)`; read every wheel's
//!   `next`; plan again if one is earlier.
//!
//! A Dekker pair (PITFALLS 3): at least one side sees the other's store.
//! Checked by `tests/loom_timer.rs` on this code.
//!
//! # Dead entries
//!
//! An entry whose wait ended early (a `recv_timeout(1h)` that completed at
//! once) is dead: it would wake nobody (its ticket is stale). Each wheel
//! purges its dead entries in bulk whenever it has doubled since the last
//! purge (and holds at least [`PURGE_FLOOR`]), so at most about as many dead
//! entries as live ones are kept, at O(1) amortized cost per insert.

use crate::sync::{fence, lock, AtomicU64, Mutex, Ordering};
use crossbeam_utils::CachePadded;
use std::time::{Duration, Instant};

/// Wheel resolution.
pub(crate) const TICK: Duration = Duration::from_millis(1);
/// Levels of a wheel.
pub(crate) const LEVELS: usize = 6;
/// Slots per level (one `u64` occupancy bitmap).
const SLOTS: usize = 64;
/// Bits of a tick number one level spans.
const LEVEL_BITS: u32 = 6;
/// Ticks the levels span (`64^LEVELS`).
const RANGE: u64 = 1 << (LEVEL_BITS as u64 * LEVELS as u64);
/// Ticks one top-level slot spans.
const TOP_SLOT: u64 = 1 << (LEVEL_BITS as u64 * (LEVELS as u64 - 1));
/// Deadlines at least this far ahead of the clock wait in `far`. The top
/// level is a ring (a deadline past the end of the clock's top-level block
/// wraps to a slot before the clock's): one slot short of the full range,
/// an entry can never land in the clock's own top slot of the next turn.
const HORIZON: u64 = RANGE - TOP_SLOT;
/// How late a worker's wheel may be before the monitor fires it for its
/// busy owner (in ticks).
pub(crate) const GRACE_TICKS: u64 = 1;
/// Below this many entries a wheel is never purged.
pub(crate) const PURGE_FLOOR: usize = 1024;
/// The largest buffer (in entries) a wheel keeps as its spare: a burst
/// bigger than this gives its buffer back when it fires.
const SPARE_CAP: usize = 16_384;
/// "No deadline" in a `next` word.
pub(crate) const NEVER: u64 = u64::MAX;

/// What a timer holds: something that can tell whether it is dead.
pub(crate) trait Expire {
    /// Would firing this wake nobody (the wait it names already ended)?
    fn is_dead(&self) -> bool;
}

impl Expire for fiber_core::Waiter {
    fn is_dead(&self) -> bool {
        self.is_stale()
    }
}

struct Entry<T> {
    /// Deadline in ticks after the timers' base, rounded up.
    at: u64,
    item: T,
}

struct Level<T> {
    /// Bit `s` set: slot `s` holds entries.
    occupied: u64,
    slots: [Vec<Entry<T>>; SLOTS],
}

impl<T> Level<T> {
    fn new() -> Level<T> {
        Level {
            occupied: 0,
            slots: std::array::from_fn(|_| Vec::new()),
        }
    }
}

/// One hierarchical timing wheel. Not synchronized: [`Timers`] keeps each
/// under a lock.
pub(crate) struct Wheel<T> {
    /// Ticks processed so far: every entry is due strictly after it.
    elapsed: u64,
    /// `LEVELS` levels (boxed: about 9 KiB of slot headers).
    levels: Box<[Level<T>]>,
    /// Entries beyond the wheel's range, moved in when it gets close.
    far: Vec<Entry<T>>,
    /// Earliest tick in `far` (`NEVER` when empty).
    far_min: u64,
    len: usize,
    /// Entries left by the last purge (the next purge runs at twice this).
    after_purge: usize,
    /// An empty buffer kept for the next slot that fires (see `advance`).
    spare: Vec<Entry<T>>,
}

/// Which level an entry due at `at` goes to, seen from `elapsed`: the
/// level of the highest 6-bit digit where the two differ.
fn level_for(elapsed: u64, at: u64) -> usize {
    let differ = (elapsed ^ at) | (SLOTS as u64 - 1);
    let significant = 63 - differ.leading_zeros();
    // A deadline past the end of the clock's top-level block (but within
    // `HORIZON`) goes to the top level, in a slot that wrapped around.
    ((significant / LEVEL_BITS) as usize).min(LEVELS - 1)
}

impl<T: Expire> Wheel<T> {
    pub(crate) fn new() -> Wheel<T> {
        Wheel {
            elapsed: 0,
            levels: (0..LEVELS).map(|_| Level::new()).collect(),
            far: Vec::new(),
            far_min: NEVER,
            len: 0,
            after_purge: 0,
            spare: Vec::new(),
        }
    }

    /// Entries held (dead ones included).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Add `item` due at tick `at`. Gives it back if it is already due
    /// (`at <= elapsed`): the caller fires it at once.
    pub(crate) fn insert(&mut self, at: u64, item: T) -> Result<(), T> {
        if at <= self.elapsed {
            return Err(item);
        }
        if self.len >= PURGE_FLOOR.max(2 * self.after_purge) {
            self.purge();
        }
        self.len += 1;
        self.place(Entry { at, item });
        Ok(())
    }

    /// Put an entry due after `elapsed` into its slot (or `far`).
    fn place(&mut self, entry: Entry<T>) {
        debug_assert!(entry.at > self.elapsed);
        if entry.at - self.elapsed >= HORIZON {
            self.far_min = self.far_min.min(entry.at);
            self.far.push(entry);
            return;
        }
        let level = level_for(self.elapsed, entry.at);
        let slot = ((entry.at >> (LEVEL_BITS * level as u32)) as usize) & (SLOTS - 1);
        let l = &mut self.levels[level];
        l.occupied |= 1 << slot;
        l.slots[slot].push(entry);
    }

    /// The next slot to process: (level, slot, its first tick). A lower
    /// bound of the earliest deadline held; `None` when the levels are empty.
    fn next_slot(&self) -> Option<(usize, usize, u64)> {
        for (level, l) in self.levels.iter().enumerate() {
            if l.occupied == 0 {
                continue;
            }
            let shift = LEVEL_BITS * level as u32;
            let now_slot = ((self.elapsed >> shift) as usize) & (SLOTS - 1);
            // Occupied slots at or after the clock's own slot at this level.
            let ahead = l.occupied.rotate_right(now_slot as u32);
            let slot = (now_slot + ahead.trailing_zeros() as usize) % SLOTS;
            let level_span = 1u64 << (shift + LEVEL_BITS);
            let block = self.elapsed & !(level_span - 1);
            let mut start = block + ((slot as u64) << shift);
            if slot < now_slot {
                // Wrapped into the next block (only the top level wraps:
                // `level_for`).
                start += level_span;
            }
            return Some((level, slot, start.max(self.elapsed)));
        }
        None
    }

    /// The tick by which this wheel must next be advanced (`NEVER` when
    /// empty). Never later than the earliest entry's deadline.
    pub(crate) fn next_tick(&self) -> u64 {
        let levels = self
            .next_slot()
            .map_or(NEVER, |(_, _, start)| start.max(self.elapsed + 1));
        levels.min(self.far_min)
    }

    /// Advance the clock to `now` (in ticks), moving entries down the
    /// levels, and push every entry due at or before `now` to `due`.
    pub(crate) fn advance(&mut self, now: u64, due: &mut Vec<T>) {
        if now <= self.elapsed {
            return;
        }
        // The entries due now, with their ticks: a slot of a higher level
        // (or `far`) fires its overdue entries in the order they were
        // armed, so a late pass sorts them by tick (stable: one tick keeps
        // arming order) before handing them out. Their wakes then happen
        // in deadline order: an `after(100ms)` message never completes a
        // `recv_timeout(70ms)` whose deadline both passed before one late
        // pass. (Already in order, the common case, the sort is one scan.)
        let mut fired: Vec<(u64, T)> = Vec::new();
        if self.far_min != NEVER && self.far_min.saturating_sub(now) < RANGE / 2 {
            // The far list comes within range: re-place it from `now`.
            let far = std::mem::take(&mut self.far);
            self.far_min = NEVER;
            for entry in far {
                if entry.at <= now {
                    self.len -= 1;
                    fired.push((entry.at, entry.item));
                } else {
                    // Back to `far` if still beyond the horizon.
                    self.place(entry);
                }
            }
        }
        while let Some((level, slot, start)) = self.next_slot() {
            if start > now {
                break;
            }
            // Everything before `start` is processed: move the clock there.
            self.elapsed = start;
            let l = &mut self.levels[level];
            l.occupied &= !(1 << slot);
            // The slot gets the spare buffer (empty, with capacity), and its
            // entries' buffer becomes the spare once drained: a wheel that
            // keeps firing reuses its buffers instead of growing a fresh
            // vector in every slot it fills.
            let mut entries = std::mem::replace(&mut l.slots[slot], std::mem::take(&mut self.spare));
            for entry in entries.drain(..) {
                if entry.at <= now {
                    self.len -= 1;
                    fired.push((entry.at, entry.item));
                } else {
                    // Later in this slot's span: a lower level takes it.
                    self.place(entry);
                }
            }
            if entries.capacity() <= SPARE_CAP {
                self.spare = entries;
            }
        }
        self.elapsed = now;
        fired.sort_by_key(|(at, _)| *at);
        due.extend(fired.into_iter().map(|(_, item)| item));
    }

    /// Drop the dead entries (also the monitor's periodic sweep: see
    /// `Timers::purge_dead`).
    pub(crate) fn purge(&mut self) {
        let mut kept = 0;
        for l in &mut self.levels {
            for (s, slot) in l.slots.iter_mut().enumerate() {
                slot.retain(|e| !e.item.is_dead());
                shrink_purged(slot);
                if slot.is_empty() {
                    l.occupied &= !(1 << s);
                }
                kept += slot.len();
            }
        }
        self.far.retain(|e| !e.item.is_dead());
        shrink_purged(&mut self.far);
        self.far_min = self.far.iter().map(|e| e.at).min().unwrap_or(NEVER);
        kept += self.far.len();
        self.len = kept;
        self.after_purge = kept;
    }

    /// Entries the slots and the far list have room for (tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        let slots: usize = self.levels.iter().flat_map(|l| l.slots.iter()).map(Vec::capacity).sum();
        slots + self.far.capacity()
    }

    /// Drop every entry.
    pub(crate) fn clear(&mut self) {
        for l in &mut self.levels {
            l.occupied = 0;
            for slot in &mut l.slots {
                *slot = Vec::new();
            }
        }
        self.far = Vec::new();
        self.far_min = NEVER;
        self.len = 0;
        self.after_purge = 0;
        self.spare = Vec::new();
    }
}

/// After a purge, a slot (or the far list) that kept less than a quarter
/// of its capacity gives the rest back: a slot is otherwise emptied only
/// when the wheel's clock reaches it (up to the horizon away; never for
/// the far list), so a burst of long waits that all ended early held its
/// memory that long.
fn shrink_purged<E>(v: &mut Vec<E>) {
    if v.capacity() > 8 && v.len() < v.capacity() / 4 {
        v.shrink_to(v.len() * 2);
    }
}

/// A wheel, and its next deadline for readers that do not take its lock.
pub(crate) struct WheelCell<T> {
    wheel: Mutex<Wheel<T>>,
    /// `Wheel::next_tick` as of the last change (`NEVER` when empty).
    /// Written under the lock; read without it as a hint (a stale value
    /// only makes a reader look too early, or the armer's handshake covers
    /// it: module docs).
    next: AtomicU64,
}

impl<T: Expire> WheelCell<T> {
    fn new() -> WheelCell<T> {
        WheelCell {
            wheel: Mutex::new(Wheel::new()),
            next: AtomicU64::new(NEVER),
        }
    }

    /// The tick by which the wheel must next be advanced (a hint).
    pub(crate) fn next_tick(&self) -> u64 {
        // Relaxed: a hint; the armer/monitor handshake orders what matters
        // with its fences.
        self.next.load(Ordering::Relaxed)
    }
}

/// What arming a timer asks of the caller.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Armed<T> {
    /// Already due: fire it now.
    Due(T),
    /// Queued; `true` if the monitor must be unparked (it plans to sleep
    /// past this deadline).
    Queued(bool),
}

/// The timer structure of one runtime: one wheel per worker slot and one
/// shared wheel.
pub(crate) struct Timers<T = fiber_core::Waiter> {
    base: Instant,
    wheels: Box<[CachePadded<WheelCell<T>>]>,
    shared: CachePadded<WheelCell<T>>,
    /// The tick at which the monitor plans to wake (`NEVER`: it is awake
    /// or will re-plan). Written by the monitor, read by armers.
    monitor_wake: CachePadded<AtomicU64>,
}

impl<T: Expire> Timers<T> {
    pub(crate) fn new(workers: usize) -> Timers<T> {
        Timers {
            base: Instant::now(),
            wheels: (0..workers).map(|_| CachePadded::new(WheelCell::new())).collect(),
            shared: CachePadded::new(WheelCell::new()),
            monitor_wake: CachePadded::new(AtomicU64::new(0)),
        }
    }

    /// The tick of `at`, rounded up (a timer never fires early).
    pub(crate) fn tick_of(&self, at: Instant) -> u64 {
        let nanos = at.saturating_duration_since(self.base).as_nanos();
        let tick = TICK.as_nanos();
        nanos.div_ceil(tick).min(NEVER as u128 - 1) as u64
    }

    /// The tick `now` is in (rounded down).
    pub(crate) fn now_tick(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.base).as_nanos() / TICK.as_nanos()).min(NEVER as u128 - 1) as u64
    }

    /// The instant tick `tick` starts.
    pub(crate) fn instant_of(&self, tick: u64) -> Instant {
        self.base
            .checked_add(Duration::from_millis(tick))
            .unwrap_or_else(|| self.base + Duration::from_secs(u32::MAX as u64))
    }

    fn cell(&self, wheel: Option<usize>) -> &WheelCell<T> {
        match wheel {
            Some(index) => &self.wheels[index],
            None => &self.shared,
        }
    }

    /// The wheel cell of worker `index` (`None`: the shared wheel).
    pub(crate) fn wheel(&self, index: Option<usize>) -> &WheelCell<T> {
        self.cell(index)
    }

    /// Arm a timer due at tick `at` in `wheel` (the current worker's own,
    /// or `None` for the shared one). The armer's half of the monitor
    /// handshake (module docs).
    pub(crate) fn arm(&self, wheel: Option<usize>, at: u64, item: T) -> Armed<T> {
        let cell = self.cell(wheel);
        let earlier = {
            let mut w = lock(&cell.wheel);
            if let Err(item) = w.insert(at, item) {
                return Armed::Due(item);
            }
            let next = w.next_tick();
            // Relaxed: published to the monitor by the fence below.
            let earlier = next < cell.next.load(Ordering::Relaxed);
            if earlier {
                cell.next.store(next, Ordering::Relaxed);
            }
            earlier
        };
        if !earlier {
            // The monitor already planned with a deadline at or before this
            // wheel's earliest (or the wheel's owner advanced it since).
            return Armed::Queued(false);
        }
        // SeqCst fence: the armer's side of the Dekker pair with
        // `plan_monitor_sleep` (publish next; fence; read monitor_wake).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        let planned = self.monitor_wake.load(Ordering::Relaxed);
        let grace = if wheel.is_some() { GRACE_TICKS } else { 0 };
        Armed::Queued(planned > at.saturating_add(grace))
    }

    /// Fire the due entries of `wheel` at `now`: pushes them to `due`.
    pub(crate) fn advance(&self, wheel: Option<usize>, now: u64, due: &mut Vec<T>) {
        let cell = self.cell(wheel);
        let mut w = lock(&cell.wheel);
        w.advance(now, due);
        // Relaxed: a hint; written under the lock (module docs).
        cell.next.store(w.next_tick(), Ordering::Relaxed);
    }

    /// Is `wheel` due at `now` (a hint)?
    pub(crate) fn is_due(&self, wheel: Option<usize>, now: u64) -> bool {
        self.cell(wheel).next_tick() <= now
    }

    /// Worker wheels that are due at `now` (hints).
    pub(crate) fn due_workers(&self, now: u64) -> impl Iterator<Item = usize> + '_ {
        (0..self.wheels.len()).filter(move |&i| self.wheels[i].next_tick() <= now)
    }

    /// The monitor's half of the handshake: it plans to wake at tick
    /// `planned` at the latest. Publishes it, then returns the tick it must
    /// really wake at: no later than any wheel's next deadline (plus the
    /// grace for worker wheels), as read after the fence.
    pub(crate) fn plan_monitor_sleep(&self, planned: u64) -> u64 {
        // Relaxed: published to armers by the fence below.
        self.monitor_wake.store(planned, Ordering::Relaxed);
        // SeqCst fence: the monitor's side of the Dekker pair with `arm`
        // (publish monitor_wake; fence; read every wheel's next).
        fence(Ordering::SeqCst);
        let earliest = self.earliest_wake();
        let wake = planned.min(earliest);
        if wake < planned {
            // Relaxed: as above; an earlier plan only wakes us sooner.
            self.monitor_wake.store(wake, Ordering::Relaxed);
        }
        wake
    }

    /// The monitor is awake (it re-plans before its next sleep): armers
    /// need not unpark it.
    pub(crate) fn monitor_awake(&self) {
        // Relaxed: an armer that reads an old, later plan unparks the
        // monitor needlessly; one that reads 0 skips the unpark, and the
        // monitor reads its wheel when it plans again (after the fence).
        self.monitor_wake.store(0, Ordering::Relaxed);
    }

    /// The earliest tick the monitor must be awake at: the shared wheel's
    /// next deadline, and each worker wheel's plus the grace.
    pub(crate) fn earliest_wake(&self) -> u64 {
        let workers = self
            .wheels
            .iter()
            .map(|c| c.next_tick().saturating_add(GRACE_TICKS))
            .min()
            .unwrap_or(NEVER);
        workers.min(self.shared.next_tick())
    }

    /// Drop the dead entries of every wheel holding at least `floor`
    /// entries; returns how many entries are left in all. The monitor's
    /// sweep: a wheel purges itself only when it doubles since its last
    /// purge, so after a burst of early-ended waits (20,000
    /// `recv_timeout(1h)` answered at once) the dead entries would stay
    /// until the wheel grew past twice the burst; the sweep bounds them by
    /// time too, and lets the deadlock check see that no live timer is
    /// left.
    pub(crate) fn purge_dead(&self, floor: usize) -> usize {
        let mut left = 0;
        for cell in self.wheels.iter().map(|c| &**c).chain(std::iter::once(&*self.shared)) {
            let mut w = lock(&cell.wheel);
            if w.len() >= floor.max(1) {
                w.purge();
                // Relaxed: a hint; written under the lock (module docs).
                cell.next.store(w.next_tick(), Ordering::Relaxed);
            }
            left += w.len();
        }
        left
    }

    /// Is any timer pending (dead ones included)?
    pub(crate) fn any_pending(&self) -> bool {
        self.shared.next_tick() != NEVER || self.wheels.iter().any(|c| c.next_tick() != NEVER)
    }

    /// Pending entries (including dead ones).
    pub(crate) fn len(&self) -> usize {
        self.wheels
            .iter()
            .map(|c| lock(&c.wheel).len())
            .chain(std::iter::once(lock(&self.shared.wheel).len()))
            .sum()
    }

    /// Drop every entry (shutdown).
    pub(crate) fn clear(&self) {
        for cell in self.wheels.iter().map(|c| &**c).chain(std::iter::once(&*self.shared)) {
            lock(&cell.wheel).clear();
            // Relaxed: under the lock, as every `next` store.
            cell.next.store(NEVER, Ordering::Relaxed);
        }
    }
}

impl<T: Expire> std::fmt::Debug for Timers<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timers").field("pending", &self.len()).finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A test item: its id, and whether its wait "ended early".
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Item(u64, bool);

    impl Expire for Item {
        fn is_dead(&self) -> bool {
            self.1
        }
    }

    fn fire(w: &mut Wheel<Item>, now: u64) -> Vec<u64> {
        let mut due = Vec::new();
        w.advance(now, &mut due);
        let mut ids: Vec<u64> = due.into_iter().map(|i| i.0).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn entries_fire_at_their_tick_never_before() {
        let mut w = Wheel::new();
        // Deadlines on every level, including slot boundaries.
        let ats: Vec<u64> = vec![
            1,
            2,
            63,
            64,
            65,
            4095,
            4096,
            4097,
            300_000,
            64u64.pow(4) + 7,
            64u64.pow(5) * 3 + 1,
        ];
        for &at in &ats {
            w.insert(at, Item(at, false)).unwrap();
        }
        assert_eq!(w.len(), ats.len());
        let mut now = 0;
        for &at in &ats {
            // One tick before: nothing of it fires.
            assert!(!fire(&mut w, at - 1).contains(&at), "{at} fired early");
            assert!(w.next_tick() <= at, "next {} is past {at}", w.next_tick());
            assert_eq!(fire(&mut w, at), vec![at]);
            now = at;
        }
        assert_eq!(w.len(), 0);
        assert_eq!(w.next_tick(), NEVER);
        assert!(fire(&mut w, now + 1_000_000).is_empty());
    }

    /// A purge gives back the room of the entries it dropped: a slot is
    /// otherwise emptied only when the clock reaches it (an hour away for
    /// a `recv_timeout(1h)` that ended at once; never for the far list,
    /// beyond the horizon). (Review 41: 32 bytes a timer of a burst stayed
    /// allocated.)
    #[test]
    fn a_purge_gives_back_the_room_of_dead_entries() {
        /// An entry whose wait ends early when the test says so.
        #[derive(Debug)]
        struct Ends(u64, std::sync::Arc<std::sync::atomic::AtomicBool>);
        impl Expire for Ends {
            fn is_dead(&self) -> bool {
                self.1.load(std::sync::atomic::Ordering::Relaxed)
            }
        }
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut w = Wheel::new();
        // One level slot and the far list, each with a burst.
        for i in 0..10_000u64 {
            w.insert(300_000, Ends(i, ended.clone())).unwrap();
            w.insert(u64::MAX / 4, Ends(i, ended.clone())).unwrap();
        }
        let live = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        w.insert(300_000, Ends(1, live)).unwrap();
        assert!(w.capacity() >= 20_000);
        ended.store(true, std::sync::atomic::Ordering::Relaxed);
        w.purge();
        assert_eq!(w.len(), 1);
        assert!(
            w.capacity() < 100,
            "{} entries of room kept after a purge",
            w.capacity()
        );
        // The live entry still fires, at its tick.
        let mut due = Vec::new();
        w.advance(299_999, &mut due);
        assert!(due.is_empty());
        w.advance(300_000, &mut due);
        assert_eq!(due.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn a_big_jump_fires_everything_due_and_keeps_the_rest() {
        let mut w = Wheel::new();
        for at in 1..=10_000u64 {
            w.insert(at * 37, Item(at * 37, false)).unwrap();
        }
        let fired = fire(&mut w, 37 * 5_000);
        assert_eq!(fired, (1..=5_000u64).map(|a| a * 37).collect::<Vec<_>>());
        // Inserting relative to the advanced clock still works.
        w.insert(37 * 5_000 + 1, Item(1, false)).unwrap();
        assert_eq!(fire(&mut w, 37 * 5_000 + 1), vec![1]);
        let rest = fire(&mut w, u64::MAX / 4);
        assert_eq!(rest.len(), 5_000);
        assert_eq!(w.len(), 0);
    }

    /// A late pass hands out what it fires in deadline order, whatever the
    /// level the entries sat on and the order they were armed in (a
    /// higher-level slot fires its overdue entries in arming order).
    #[test]
    fn a_late_pass_fires_in_deadline_order() {
        let mut w = Wheel::new();
        // Armed latest first, spread over levels 0 to 2.
        let ats: Vec<u64> = (1..=200u64).rev().map(|k| k * 47).collect();
        for &at in &ats {
            w.insert(at, Item(at, false)).unwrap();
        }
        let mut due = Vec::new();
        w.advance(200 * 47, &mut due);
        let fired: Vec<u64> = due.into_iter().map(|i| i.0).collect();
        assert_eq!(fired, (1..=200u64).map(|k| k * 47).collect::<Vec<_>>());
    }

    #[test]
    fn an_entry_already_due_is_given_back() {
        let mut w = Wheel::new();
        assert!(fire(&mut w, 100).is_empty());
        assert_eq!(w.insert(100, Item(1, false)), Err(Item(1, false)));
        assert_eq!(w.insert(50, Item(2, false)), Err(Item(2, false)));
        assert!(w.insert(101, Item(3, false)).is_ok());
    }

    #[test]
    fn deadlines_beyond_the_range_wait_in_the_far_list() {
        let mut w = Wheel::new();
        let far = RANGE * 3 + 5;
        w.insert(far, Item(9, false)).unwrap();
        w.insert(NEVER - 1, Item(10, false)).unwrap();
        assert_eq!(w.next_tick(), far);
        assert!(fire(&mut w, far - 1).is_empty());
        assert_eq!(fire(&mut w, far), vec![9]);
        assert_eq!(w.len(), 1);
        assert!(fire(&mut w, NEVER - 2).is_empty());
        assert_eq!(fire(&mut w, NEVER - 1), vec![10]);
    }

    /// Deadlines that cross the top level's boundary, or sit almost a
    /// whole wheel ahead, fire once at their tick (the top level is a ring:
    /// an entry must never land in the clock's own top slot of the next
    /// turn, or the wheel would re-place it forever).
    #[test]
    fn deadlines_near_the_top_boundary_and_the_range_fire_at_their_tick() {
        let top_span = 1u64 << (LEVEL_BITS * (LEVELS as u32 - 1));
        for start in [RANGE - 1, RANGE - 3, 5 * top_span + 7, RANGE + 3 * top_span - 2] {
            let mut w = Wheel::new();
            assert!(fire(&mut w, start).is_empty());
            let ats = [
                start + 1,
                start + 6,
                RANGE.max(start + 1) + 5,
                start + RANGE - top_span - 1,
                start + RANGE - top_span,
                start + RANGE - 1,
                start + RANGE + 9,
            ];
            for (i, &at) in ats.iter().enumerate() {
                w.insert(at, Item(i as u64, false)).unwrap();
            }
            let mut sorted: Vec<(u64, u64)> = ats.iter().enumerate().map(|(i, &a)| (a, i as u64)).collect();
            sorted.sort_unstable();
            let mut fired = 0;
            for (at, id) in sorted {
                let before = fire(&mut w, at - 1);
                assert!(!before.contains(&id), "{id} (tick {at}) fired early (start {start})");
                fired += before.len();
                let now = fire(&mut w, at);
                fired += now.len();
                assert!(w.next_tick() > at, "next {} not past {at}", w.next_tick());
            }
            assert_eq!(fired, ats.len(), "start {start}");
            assert_eq!(w.len(), 0);
        }
    }

    /// Random inserts and clock jumps (small and huge, across level and
    /// top-level boundaries) against a reference: every entry fires at the
    /// first advance that reaches its tick, never before, exactly once.
    #[test]
    fn random_inserts_and_jumps_match_a_reference() {
        let mut rng = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..20 {
            let mut w = Wheel::new();
            let mut now = if round % 2 == 0 { 0 } else { RANGE - 1000 };
            let mut pending: std::collections::BTreeMap<u64, u64> = Default::default();
            let mut id = 0u64;
            for _ in 0..2000 {
                let r = next();
                if r % 3 == 0 {
                    let scale = [64u64, 4096, 262_144, 1 << 24, 1 << 30, RANGE, RANGE * 4][(r >> 8) as usize % 7];
                    let at = now + 1 + next() % scale;
                    id += 1;
                    w.insert(at, Item(id, false)).unwrap();
                    pending.insert(id, at);
                } else {
                    let scale = [1u64, 3, 64, 5000, 1 << 20, 1 << 31][(r >> 8) as usize % 6];
                    now += next() % scale;
                    let fired = fire(&mut w, now);
                    for f in &fired {
                        let at = pending.remove(f).expect("fired once");
                        assert!(at <= now, "entry due at {at} fired at {now}");
                    }
                    assert!(
                        pending.values().all(|&at| at > now),
                        "an entry due by {now} did not fire"
                    );
                    assert_eq!(w.len(), pending.len());
                    assert!(w.next_tick() > now);
                    if let Some(&min) = pending.values().min() {
                        assert!(w.next_tick() <= min, "next {} past the earliest {min}", w.next_tick());
                    }
                }
            }
        }
    }

    #[test]
    fn dead_entries_are_purged_in_bulk() {
        let mut w = Wheel::new();
        for at in 1..=100_000u64 {
            // All dead but every 1,000th.
            w.insert(3_600_000 + at, Item(at, at % 1000 != 0)).unwrap();
            assert!(w.len() <= PURGE_FLOOR.max(2 * 100) + 1, "{} entries kept", w.len());
        }
        let fired = fire(&mut w, 3_600_000 + 100_000);
        assert!(fired.iter().filter(|&&id| id % 1000 == 0).count() == 100);
    }

    #[test]
    fn rounding_makes_ticks_late_never_early() {
        let t: Timers<Item> = Timers::new(1);
        let at = t.base + Duration::from_micros(10_500);
        assert_eq!(t.tick_of(at), 11);
        assert_eq!(t.now_tick(at), 10);
        assert!(t.instant_of(t.tick_of(at)) >= at);
        assert_eq!(t.tick_of(t.base + Duration::from_secs(1)), 1000);
    }

    #[test]
    fn arming_reports_the_monitor_unpark_only_for_an_earlier_deadline() {
        let t: Timers<Item> = Timers::new(2);
        // The monitor plans to wake at tick 100.
        assert_eq!(t.plan_monitor_sleep(100), 100);
        assert_eq!(t.arm(Some(0), 50, Item(1, false)), Armed::Queued(true));
        // Not earlier than what wheel 0 holds: no unpark needed.
        assert_eq!(t.arm(Some(0), 60, Item(2, false)), Armed::Queued(false));
        // The monitor re-plans: the wheel's deadline plus grace.
        assert_eq!(t.plan_monitor_sleep(100), 50 + GRACE_TICKS);
        // Plain threads (shared wheel) get no grace.
        assert_eq!(t.arm(None, 40, Item(3, false)), Armed::Queued(true));
        assert_eq!(t.plan_monitor_sleep(100), 40);
        let mut due = Vec::new();
        t.advance(Some(0), 60, &mut due);
        t.advance(None, 60, &mut due);
        assert_eq!(due.len(), 3);
        assert!(!t.any_pending());
        // A deadline at or before a wheel's clock is due at once.
        assert_eq!(t.arm(Some(0), 60, Item(4, false)), Armed::Due(Item(4, false)));
        assert_eq!(t.arm(Some(0), 10, Item(5, false)), Armed::Due(Item(5, false)));
    }
}
