//! The worker sleep/notify handshake: a worker sleeps only after seeing no
//! work, and a notifier never lets published work sit unseen while every
//! worker sleeps.
//!
//! # Protocol
//!
//! Worker going to sleep (`Idle::prepare_sleep` ... `Idle::sleep`):
//! 1. arm its futex word (0), announce itself in the sleeper list and count;
//! 2. `fence(SeqCst)`;
//! 3. look for work once more; if there is any, retract the announcement
//!    (or, if a notifier already popped it, accept the notification) and run;
//! 4. otherwise wait on the futex word until a notifier sets it to 1.
//!
//! Notifier (after publishing work, `Idle::notify_one`):
//! 1. `fence(SeqCst)`; 2. if a worker is searching, stop (it will find the
//!    work, and the last searcher to find work notifies another); 3. pop one
//!    sleeper, set its word to 1 (Release) and wake it.
//!
//! The two fences make a Dekker pair (publish work; fence; read sleepers) vs
//! (announce; fence; read queues): at least one side sees the other, so work
//! is either found in step 3 or the sleeper is woken. One notify wakes at most
//! one sleeper (no thundering herd). Checked by `tests/loom_idle.rs`.

use crate::sync::{fence, lock, AtomicBool, AtomicU32, AtomicUsize, Mutex, Ordering};

/// Futex word values.
pub(crate) const WAITING: u32 = 0;
pub(crate) const NOTIFIED: u32 = 1;

/// Which workers sleep, and how many search.
#[derive(Debug)]
pub(crate) struct Idle {
    sleepers: Mutex<Vec<usize>>,
    /// Fast-path copy of `sleepers.len()`.
    num_sleeping: AtomicUsize,
    /// Workers spinning for work (not yet announced as sleepers).
    num_searching: AtomicUsize,
}

/// What a worker that announced sleep should do after its last look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retract {
    /// It removed its announcement: nobody will notify it.
    Retracted,
    /// A notifier already popped it and set (or is setting) its word: it is
    /// awake by notification.
    Notified,
}

impl Idle {
    pub(crate) fn new(capacity: usize) -> Idle {
        Idle {
            sleepers: Mutex::new(Vec::with_capacity(capacity)),
            num_sleeping: AtomicUsize::new(0),
            num_searching: AtomicUsize::new(0),
        }
    }

    /// Steps 1-2 of going to sleep: arm `word`, announce `worker`, fence.
    /// The caller must look for work once more afterwards.
    pub(crate) fn prepare_sleep(&self, worker: usize, word: &AtomicU32) {
        // Relaxed: ordered before the announcement by the sleepers lock; a
        // notifier sets it only after popping us under that lock, and
        // shutdown (which sets it without the lock) is ordered against it
        // by the fences here and in `publish_shutdown`.
        word.store(WAITING, Ordering::Relaxed);
        {
            let mut sleepers = lock(&self.sleepers);
            sleepers.push(worker);
            // Relaxed: the fence below orders it for notifiers.
            self.num_sleeping.fetch_add(1, Ordering::Relaxed);
        }
        // SeqCst fence: the worker side of the Dekker pair with
        // `notify_one` (announce; fence; read queues).
        fence(Ordering::SeqCst);
    }

    /// Shutdown's half of the sleep handshake: store `shutdown`, fence,
    /// then leave NOTIFIED in every worker's word (the caller then wakes
    /// each word's futex). A worker going to sleep stores WAITING in its
    /// word, fences (`prepare_sleep`) and then reads `shutdown`: a
    /// store-then-load pair on two locations on each side, so each side
    /// needs its SeqCst fence (PITFALLS 3). Without this one, the worker's
    /// WAITING could land after our NOTIFIED while its read of `shutdown`
    /// still saw `false`: it would sleep for good
    /// (`loom_shutdown_wakes_a_worker_going_to_sleep`).
    pub(crate) fn publish_shutdown<'a>(shutdown: &AtomicBool, words: impl IntoIterator<Item = &'a AtomicU32>) {
        // Release: pairs with the Acquire in `Shared::is_shutdown`.
        shutdown.store(true, Ordering::Release);
        // SeqCst fence: pairs with the one in `prepare_sleep` (above).
        fence(Ordering::SeqCst);
        for word in words {
            // Release: a woken worker that reads NOTIFIED sees what came
            // before (the shutdown flag).
            word.store(NOTIFIED, Ordering::Release);
        }
    }

    /// Step 3 when work turned up: undo the announcement if still listed.
    pub(crate) fn retract(&self, worker: usize) -> Retract {
        let mut sleepers = lock(&self.sleepers);
        match sleepers.iter().position(|&w| w == worker) {
            Some(at) => {
                sleepers.swap_remove(at);
                self.num_sleeping.fetch_sub(1, Ordering::Relaxed);
                Retract::Retracted
            }
            None => Retract::Notified,
        }
    }

    /// Step 4: has a notifier set `word`? Acquire pairs with the Release
    /// store in `notify_one`, so the worker sees the work published before.
    pub(crate) fn is_notified(word: &AtomicU32) -> bool {
        word.load(Ordering::Acquire) == NOTIFIED
    }

    /// A worker starts spinning for work.
    pub(crate) fn start_searching(&self) {
        self.num_searching.fetch_add(1, Ordering::SeqCst);
    }

    /// A worker starts spinning for work if fewer than `limit` do (tokio
    /// lets at most half its workers search, Go half its busy ones): each
    /// search looks at every worker's deque, so a thousand idle workers
    /// all searching at once cost a million looks a round, and a runtime
    /// of 1,024 workers took seconds to start and to run a few thousand
    /// fibers (`adversarial_review3.rs::the_maximum_worker_count_builds_runs_and_shuts_down`).
    /// One that may not search goes to sleep through the usual handshake
    /// (its last look sees work published meanwhile), and the last searcher
    /// to find work wakes another, so capping loses no wake-up.
    pub(crate) fn try_start_searching(&self, limit: usize) -> bool {
        // Relaxed: a cap, not part of the handshake; `start_searching`'s
        // SeqCst increment (below) is what the notifier's check reads.
        if self.num_searching.load(Ordering::Relaxed) >= limit {
            return false;
        }
        self.start_searching();
        true
    }

    /// A searching worker stops (found work, or goes to sleep). Returns
    /// `true` if it was the last searcher.
    pub(crate) fn stop_searching(&self) -> bool {
        self.num_searching.fetch_sub(1, Ordering::SeqCst) == 1
    }

    /// Workers currently asleep (diagnostics and scaling decisions).
    pub(crate) fn sleeping(&self) -> usize {
        self.num_sleeping.load(Ordering::Relaxed)
    }

    /// Wake one sleeping worker unless a worker is searching (it will find
    /// the work). `word_of(i)` is worker `i`'s futex word. Returns the woken
    /// worker.
    pub(crate) fn notify_one<'a>(&self, word_of: impl Fn(usize) -> &'a AtomicU32) -> Option<usize> {
        // SeqCst fence: the notifier side of the Dekker pair with
        // `prepare_sleep` (publish work; fence; read sleepers).
        fence(Ordering::SeqCst);
        // Relaxed loads: ordered by the fence above.
        if self.num_searching.load(Ordering::Relaxed) > 0 || self.num_sleeping.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let worker = {
            let mut sleepers = lock(&self.sleepers);
            let worker = sleepers.pop()?;
            self.num_sleeping.fetch_sub(1, Ordering::Relaxed);
            worker
        };
        wake(word_of(worker));
        Some(worker)
    }

    /// Wake `worker` if it is asleep (a targeted push to its inbox). Returns
    /// `true` if it was asleep.
    pub(crate) fn notify_worker(&self, worker: usize, word: &AtomicU32) -> bool {
        // SeqCst fence: as in `notify_one` (the caller published the work
        // before the call: its inbox push). Both callers also fenced after
        // their pushes already (`push_inbox`); this one keeps the function
        // correct on its own.
        fence(Ordering::SeqCst);
        if self.num_sleeping.load(Ordering::Relaxed) == 0 {
            return false;
        }
        if self.retract(worker) == Retract::Retracted {
            wake(word);
            true
        } else {
            false
        }
    }
}

/// Set a popped sleeper's word and wake it. A wake always writes (swap would
/// do too): a CAS that skipped the store when already set could drop the
/// release edge the sleeper needs (PITFALLS 12).
fn wake(word: &AtomicU32) {
    // Release: pairs with the Acquire in `Idle::is_notified`.
    word.store(NOTIFIED, Ordering::Release);
    crate::sync::futex_wake_one(word);
}

/// The handshake of a worker that sleeps waiting for I/O in the driver
/// (`io_park`) instead of on its futex word: it does not watch the word
/// while it waits there, so a notifier that sets the word must also wake
/// its driver wait. Worker: `enter` (flag; `fence(SeqCst)`; read the word)
/// before it blocks, `leave` after. Notifier, after setting the word:
/// `must_wake` (`fence(SeqCst)`; read the flag). A Dekker pair: either the
/// worker sees the word set and does not block, or the notifier sees the
/// flag and wakes the wait. Checked by `tests/loom_idle.rs`
/// (`loom_io_park_notify`).
#[derive(Debug, Default)]
pub(crate) struct IoWaiting(AtomicBool);

impl IoWaiting {
    /// Before blocking in the driver: `true` if the word is already set
    /// (then do not block; the flag is cleared again).
    pub(crate) fn enter(&self, word: &AtomicU32) -> bool {
        // Relaxed: ordered by the fence below.
        self.0.store(true, Ordering::Relaxed);
        // SeqCst fence: the worker's half of the pair with `must_wake`
        // (flag; fence; read word).
        fence(Ordering::SeqCst);
        if Idle::is_notified(word) {
            self.leave();
            return true;
        }
        false
    }

    /// After the driver wait returned.
    pub(crate) fn leave(&self) {
        // Relaxed: a stale `true` costs the notifier one spurious wake.
        self.0.store(false, Ordering::Relaxed);
    }

    /// After setting the worker's word: must its driver wait be woken?
    pub(crate) fn must_wake(&self) -> bool {
        // SeqCst fence: the notifier's half (word set; fence; read flag).
        fence(Ordering::SeqCst);
        // Relaxed: ordered by the fence above.
        self.0.load(Ordering::Relaxed)
    }
}
