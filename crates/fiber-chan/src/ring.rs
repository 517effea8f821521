//! The buffer of a bounded channel (`cap > 0`): a fixed ring of slots with
//! per-slot stamps and two position words, `head` and `tail` (spec
//! section 2a). Sends and receives claim a position with one CAS and never
//! take the channel lock; the lock is only for parking (`chan.rs`).
//!
//! # Positions and stamps
//!
//! A position is `lap | index` with `index < cap` in the low bits and the
//! lap counted in multiples of `one_lap` (a power of two above `2 * cap`).
//! The bit `mark` (between the two) is set in `tail` when the channel
//! closes: no position is claimed for a new send afterwards.
//!
//! A slot's stamp says who may touch it:
//!
//! * `stamp == p` (the position a sender sees at `tail`): free for the send
//!   at position `p`;
//! * `stamp == p + 1`: written for position `p`, ready for the receive there;
//! * `stamp == p + 2`: reserved by a select's send arm, to be written when
//!   the select completes (it stores `p + 1` then);
//! * `stamp == p + one_lap`: taken; free for the send one lap later.
//!
//! Between a claim (the CAS on `tail`) and the stamp store that follows it
//! at once, the slot is *busy*; so it is between a receive's CAS on `head`
//! and its stamp store. A party about to park never parks on a busy slot:
//! it waits for the stamp (the other party is running and needs nothing
//! of ours), see `chan.rs`.
//!
//! A claimed slot is owned by its claimer until it stores the next stamp
//! (Release), which pairs with the Acquire load of the stamp by the next
//! owner. A slot's value is an `Option<T>`: `None` is a *hole* (a select's
//! reserved position given back without a value), which receivers skip.

use crate::sync::{moved_on, seqcst_rmw_point, AtomicBool, AtomicUsize, Ordering, UnsafeCell};
// Keeps `head` and `tail` on separate cache lines.
use crossbeam_utils::CachePadded as Padded;

struct Slot<T> {
    stamp: AtomicUsize,
    /// Written with the value, before the stamp: the slot is a hole (so
    /// `skip_holes` can tell without touching the value).
    hole: AtomicBool,
    value: UnsafeCell<Option<T>>,
}

/// Outcome of [`Ring::pop`].
pub(crate) enum Pop {
    /// A value taken (moved into the caller's slot).
    Value,
    /// Nothing buffered; `closed` if `tail` carries the mark.
    Empty { closed: bool },
    /// The position at `head` is claimed but its stamp not yet stored (a
    /// send between its claim and its write): a moment.
    Busy,
    /// The position at `head` is reserved by a select's send arm: its
    /// completion writes it and then settles parked waiters. `freed`:
    /// holes were taken on the way, so slots were freed (parked senders
    /// must be told).
    Reserved { freed: bool },
}

/// What the slot at `head` holds (for readiness checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Head {
    /// A value (or a hole) to take.
    Ready,
    /// Nothing claimed beyond `head`.
    Empty,
    /// See [`Pop::Busy`].
    Busy,
    /// See [`Pop::Reserved`].
    Reserved,
}

/// Outcome of a failed [`Ring::claim`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoRoom {
    /// Every slot holds a value.
    Full,
    /// The slot at `tail` is still being read by the receive of the
    /// previous lap (it frees it in a moment and then settles parked
    /// waiters).
    Busy,
    /// `tail` carries the close mark.
    Closed,
}

/// A claimed, not yet written position (its slot index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Claim(pub(crate) usize);

pub(crate) struct Ring<T> {
    head: Padded<AtomicUsize>,
    tail: Padded<AtomicUsize>,
    slots: Box<[Slot<T>]>,
    cap: usize,
    mark: usize,
    one_lap: usize,
}

// SAFETY: a slot's value is touched only by the party that claimed its
// position (module docs), so values move between threads: `T: Send`.
unsafe impl<T: Send> Send for Ring<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Ring<T> {}

/// Panic, naming the misuse, if a ring of `cap` slots of `T` cannot be
/// addressed (its lap arithmetic needs `2 * (cap + 1).next_power_of_two()`
/// to fit in a `usize`) or allocated (at most `isize::MAX` bytes).
#[track_caller]
pub(crate) fn check_capacity<T>(cap: usize) {
    let addressable = cap <= usize::MAX / 4;
    let bytes = cap.checked_mul(std::mem::size_of::<Slot<T>>());
    if !addressable || bytes.is_none_or(|b| b > isize::MAX as usize) {
        panic!(
            "fiber::chan::bounded({cap}): the capacity is too large for a buffer of {} values of {} bytes \
             each (allocated up front); use fiber::chan::unbounded for a channel without a limit",
            cap,
            std::mem::size_of::<T>()
        );
    }
}

impl<T> Ring<T> {
    pub(crate) fn new(cap: usize) -> Ring<T> {
        assert!(cap > 0, "a ring has at least one slot");
        let mark = (cap + 1).next_power_of_two();
        let one_lap = mark * 2;
        Ring {
            head: Padded::new(AtomicUsize::new(0)),
            tail: Padded::new(AtomicUsize::new(0)),
            slots: (0..cap)
                .map(|i| Slot {
                    stamp: AtomicUsize::new(i),
                    hole: AtomicBool::new(false),
                    value: UnsafeCell::new(None),
                })
                .collect(),
            cap,
            mark,
            one_lap,
        }
    }

    /// The position after `pos` (`pos` without the mark).
    fn next(&self, pos: usize) -> usize {
        let index = pos & (self.mark - 1);
        if index + 1 < self.cap {
            pos + 1
        } else {
            (pos & !(self.one_lap - 1)).wrapping_add(self.one_lap)
        }
    }

    /// Claim the position at `tail` for a send. `ignore_mark`: a sender
    /// admitted before the close (it was parked then) still gets a place.
    pub(crate) fn claim(&self, ignore_mark: bool) -> Result<Claim, NoRoom> {
        // Relaxed: the CAS below decides; the stamp load orders the slot.
        let mut tail = self.tail.load(Ordering::Relaxed);
        let mut contended = 0;
        loop {
            let marked = tail & self.mark;
            if marked != 0 && !ignore_mark {
                return Err(NoRoom::Closed);
            }
            let pos = tail & !self.mark;
            let index = pos & (self.mark - 1);
            let slot = &self.slots[index];
            // Acquire: pairs with the Release stamp store of the receive
            // that freed the slot (its read of the old value happens before
            // our write).
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == pos {
                let new = self.next(pos) | marked;
                // SeqCst: the claim is the send's linearization point, in
                // one total order with the close mark and with `head`.
                match self
                    .tail
                    .compare_exchange_weak(tail, new, Ordering::SeqCst, Ordering::Relaxed)
                {
                    Ok(_) => {
                        seqcst_rmw_point();
                        return Ok(Claim(index));
                    }
                    Err(t) => {
                        crate::sync::cas_backoff(&mut contended);
                        tail = t;
                    }
                }
            } else if stamp.wrapping_add(self.one_lap) == pos + 1 || stamp.wrapping_add(self.one_lap) == pos + 2 {
                // The slot still holds (or is handing out, or is reserved
                // for) last lap's value. (The Acquire stamp load above
                // keeps this load after it.) SeqCst: part of a parking
                // sender's re-check (see `Chan::announce`).
                let head = self.head.load(Ordering::SeqCst);
                return Err(if head.wrapping_add(self.one_lap) == pos {
                    NoRoom::Full
                } else {
                    NoRoom::Busy
                });
            } else {
                // Another send claimed `pos` meanwhile.
                moved_on();
                tail = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Mark a claimed position as reserved (a select's send arm; written
    /// later with `fill`).
    pub(crate) fn reserve(&self, claim: Claim) {
        let slot = &self.slots[claim.0];
        // Relaxed: we read this stamp in `claim`; nobody else changes it
        // while the position is claimed.
        let stamp = slot.stamp.load(Ordering::Relaxed);
        // Release: pairs with the Acquire stamp loads in `pop`/`head`.
        slot.stamp.store(stamp.wrapping_add(2), Ordering::Release);
    }

    /// Write a reserved position (`None`: a hole) and publish it; the
    /// value is moved out of `value`.
    pub(crate) fn fill(&self, claim: Claim, value: &mut Option<T>) {
        let slot = &self.slots[claim.0];
        // Relaxed: as in `reserve` (the reserving fiber stored it).
        let reserved = slot.stamp.load(Ordering::Relaxed);
        self.publish(slot, reserved.wrapping_sub(1), value);
    }

    /// Give a reserved position back without a value. If no position was
    /// claimed after it, `tail` moves back over it and the slot is free for
    /// the next send (the channel keeps its capacity); otherwise it becomes
    /// a hole, which receivers skip. Returns `true` if it was rolled back.
    pub(crate) fn give_back(&self, claim: Claim) -> bool {
        let slot = &self.slots[claim.0];
        // Relaxed: as in `fill` (the reserving fiber stored it).
        let reserved = slot.stamp.load(Ordering::Relaxed);
        let pos = reserved.wrapping_sub(2);
        // SeqCst: as in `claim` (one order with the claims and the close).
        let tail = self.tail.load(Ordering::SeqCst);
        if tail & !self.mark == self.next(pos) {
            // Free for a send at `pos` again; until `tail` is back at `pos`
            // nobody can claim it (a claim needs `tail == pos`), and a
            // receive at `head == pos` reads it as busy and waits.
            // Release: pairs with the Acquire stamp load in `claim` of the
            // send that claims `pos` once `tail` is back.
            slot.stamp.store(pos, Ordering::Release);
            // SeqCst: as in `claim`; fails if a send claimed the next
            // position or the close mark was set meanwhile.
            if self
                .tail
                .compare_exchange(tail, pos | (tail & self.mark), Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                seqcst_rmw_point();
                return true;
            }
            self.publish(slot, pos.wrapping_add(1), &mut None);
            return false;
        }
        self.publish(slot, pos.wrapping_add(1), &mut None);
        false
    }

    /// Write a claimed position (`None`: a hole) and publish it; the
    /// value is moved out of `value`.
    pub(crate) fn write(&self, claim: Claim, value: &mut Option<T>) {
        let slot = &self.slots[claim.0];
        // Relaxed: the claimer read this stamp itself in `claim`; nobody
        // else changes it while the position is claimed.
        let stamp = slot.stamp.load(Ordering::Relaxed);
        self.publish(slot, stamp.wrapping_add(1), value);
    }

    fn publish(&self, slot: &Slot<T>, stamp: usize, value: &mut Option<T>) {
        // Relaxed: published by the Release stamp store below.
        slot.hole.store(value.is_none(), Ordering::Relaxed);
        // SAFETY: the claim owns the slot until the stamp store below. The
        // slot is empty (its last value was taken by `pop`), so a swap
        // moves the value in, in place (no copy of a large value on the
        // stack; see `spec/chan.md`, "Large values").
        slot.value.with_mut(|v| unsafe {
            debug_assert!((*v).is_none(), "a ring slot is written once per lap");
            // The slot and the caller's `value` are distinct places.
            std::ptr::swap_nonoverlapping(v, value, 1)
        });
        // Release: pairs with the Acquire stamp load in `pop`.
        slot.stamp.store(stamp, Ordering::Release);
    }

    /// Take the value at `head`, skipping holes, moving it into `out`
    /// (which must be empty).
    pub(crate) fn pop(&self, out: &mut Option<T>) -> Pop {
        debug_assert!(out.is_none(), "pop moves into an empty slot");
        // Relaxed: the CAS below decides; the stamp load orders the slot.
        let mut head = self.head.load(Ordering::Relaxed);
        let mut contended = 0;
        let mut freed = false;
        loop {
            let index = head & (self.mark - 1);
            let slot = &self.slots[index];
            // Acquire: pairs with the Release stamp store in `write`.
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == head.wrapping_add(1) {
                // SeqCst: as in `claim`.
                match self
                    .head
                    .compare_exchange_weak(head, self.next(head), Ordering::SeqCst, Ordering::Relaxed)
                {
                    Ok(_) => {
                        seqcst_rmw_point();
                        // SAFETY: the position is ours until the stamp
                        // store below.
                        // (The slot and `out` are distinct places.)
                        slot.value
                            .with_mut(|v| unsafe { std::ptr::swap_nonoverlapping(v, out, 1) });
                        // Release: pairs with the Acquire stamp load in
                        // `claim` one lap later.
                        slot.stamp.store(head.wrapping_add(self.one_lap), Ordering::Release);
                        if out.is_some() {
                            return Pop::Value;
                        }
                        freed = true;
                        head = self.head.load(Ordering::Relaxed);
                    }
                    Err(h) => {
                        crate::sync::cas_backoff(&mut contended);
                        head = h;
                    }
                }
            } else if stamp == head {
                // Not written for this lap, so `head` cannot move past it:
                // if `tail` equals it when we read it (after the Acquire
                // stamp load), the ring was empty at that moment. SeqCst:
                // part of a parking receiver's re-check (see
                // `Chan::announce`).
                let tail = self.tail.load(Ordering::SeqCst);
                if tail & !self.mark == head {
                    return Pop::Empty {
                        closed: tail & self.mark != 0,
                    };
                }
                return Pop::Busy;
            } else if stamp == head.wrapping_add(2) {
                return Pop::Reserved { freed };
            } else {
                // Another receive took `head` meanwhile.
                moved_on();
                head = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// Take the holes at `head` (a given-back reservation there frees its
    /// slot at once instead of when the next receive passes).
    pub(crate) fn skip_holes(&self) {
        loop {
            let head = self.head.load(Ordering::Relaxed);
            let slot = &self.slots[head & (self.mark - 1)];
            // Acquire: pairs with the Release stamp store in `write` (the
            // hole flag was written before it).
            if slot.stamp.load(Ordering::Acquire) != head.wrapping_add(1) || !slot.hole.load(Ordering::Relaxed) {
                return;
            }
            // SeqCst: as in `pop`. If `head` moved, the flag we read may
            // belong to another position: the CAS fails and we look again.
            if self
                .head
                .compare_exchange(head, self.next(head), Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                // SAFETY: the position is ours until the stamp store.
                slot.value.with_mut(|v| unsafe { *v = None });
                // Release: as in `pop`.
                slot.stamp.store(head.wrapping_add(self.one_lap), Ordering::Release);
            }
        }
    }

    /// Is a value (or a hole) ready at `head`? (A hint; holes are rare
    /// and cost one spurious retry.)
    pub(crate) fn has_ready(&self) -> bool {
        self.head() == Head::Ready
    }

    /// What the slot at `head` holds now.
    pub(crate) fn head(&self) -> Head {
        loop {
            // SeqCst (here and on `tail`): part of a parking receiver's
            // re-check (see `Chan::announce`).
            let head = self.head.load(Ordering::SeqCst);
            let slot = &self.slots[head & (self.mark - 1)];
            // Acquire: pairs with the Release stamp store in `publish`.
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == head.wrapping_add(1) {
                return Head::Ready;
            } else if stamp == head.wrapping_add(2) {
                return Head::Reserved;
            } else if stamp == head {
                let tail = self.tail.load(Ordering::SeqCst);
                return if tail & !self.mark == head {
                    Head::Empty
                } else {
                    Head::Busy
                };
            }
            // `head` moved on meanwhile: look again.
            moved_on();
        }
    }

    /// Is the slot at `tail` free (a send could claim it)? A hint.
    pub(crate) fn has_room(&self) -> bool {
        self.room().is_ok()
    }

    /// Is the slot at `tail` free now (ignoring the close mark)? `Busy`:
    /// its last receive is between its claim and its stamp store.
    pub(crate) fn room(&self) -> Result<(), NoRoom> {
        loop {
            // SeqCst (here and on `head`): part of a parking sender's
            // re-check (see `Chan::announce`).
            let pos = self.tail.load(Ordering::SeqCst) & !self.mark;
            let slot = &self.slots[pos & (self.mark - 1)];
            // Acquire: pairs with the Release stamp store in `pop`.
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == pos {
                return Ok(());
            }
            let last = stamp.wrapping_add(self.one_lap);
            if last == pos + 1 || last == pos + 2 {
                let head = self.head.load(Ordering::SeqCst);
                return Err(if head.wrapping_add(self.one_lap) == pos {
                    NoRoom::Full
                } else {
                    NoRoom::Busy
                });
            }
            // `tail` moved on meanwhile: look again.
            moved_on();
        }
    }

    /// No position is claimed beyond `head` (nothing written, nothing in
    /// progress).
    pub(crate) fn is_drained(&self) -> bool {
        // SeqCst (both): one consistent view of the two words.
        let tail = self.tail.load(Ordering::SeqCst);
        let head = self.head.load(Ordering::SeqCst);
        tail & !self.mark == head
    }

    /// Set the close mark; `true` if this call set it.
    pub(crate) fn close(&self) -> bool {
        // SeqCst: the close's linearization point, in one order with the
        // claims (a claim after it sees the mark).
        self.tail.fetch_or(self.mark, Ordering::SeqCst) & self.mark == 0
    }

    /// Positions free for a claim now: the capacity less [`len`](Self::len)
    /// (a hint, like `len`).
    pub(crate) fn free(&self) -> usize {
        self.cap.saturating_sub(self.len())
    }

    /// Positions claimed and not yet taken (values, holes and reservations).
    pub(crate) fn len(&self) -> usize {
        loop {
            // SeqCst: a consistent snapshot (re-checked below).
            let tail = self.tail.load(Ordering::SeqCst);
            let head = self.head.load(Ordering::SeqCst);
            if self.tail.load(Ordering::SeqCst) != tail {
                continue;
            }
            let hix = head & (self.mark - 1);
            let tix = tail & (self.mark - 1);
            return if hix < tix {
                tix - hix
            } else if hix > tix {
                self.cap - hix + tix
            } else if tail & !self.mark == head {
                0
            } else {
                self.cap
            };
        }
    }
}
