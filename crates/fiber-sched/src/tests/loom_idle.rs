//! Loom models of the worker sleep/notify handshake (`idle.rs`), run by
//! `cargo xtask loom`. The run queue is a loom-visible flag standing in for
//! crossbeam's queues (which loom cannot see).

use crate::idle::{Idle, Retract};
use crate::sync::{AtomicBool, AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Model {
    idle: Idle,
    words: [AtomicU32; 2],
    work: AtomicBool,
}

impl Model {
    fn new() -> Arc<Model> {
        Arc::new(Model {
            idle: Idle::new(2),
            words: [AtomicU32::new(1), AtomicU32::new(1)],
            work: AtomicBool::new(false),
        })
    }

    /// Publish work, then notify (what `Schedule::schedule` does).
    fn publish(&self) -> Option<usize> {
        // Relaxed: the queue stand-in; the fences of the protocol order it.
        self.work.store(true, Ordering::Relaxed);
        self.idle.notify_one(|i| &self.words[i])
    }

    /// A worker that found nothing goes to sleep: announce, look again.
    /// Returns `true` if it saw the work on its last look.
    fn go_to_sleep(&self, worker: usize) -> bool {
        self.idle.prepare_sleep(worker, &self.words[worker]);
        if self.work.load(Ordering::Relaxed) {
            if self.idle.retract(worker) == Retract::Notified {
                // A notifier popped us too; its word store is on the way.
            }
            return true;
        }
        false
    }
}

/// Work published while a worker decides to sleep: either its last look
/// sees the work or the notifier wakes it. Removing the fence in
/// `prepare_sleep` (or in `notify_one`) loses the wakeup.
#[test]
fn loom_sleep_races_publish() {
    loom::model(|| {
        let model = Model::new();
        let producer = {
            let model = model.clone();
            thread::spawn(move || model.publish())
        };
        let saw_work = model.go_to_sleep(0);
        let woke = producer.join().unwrap();
        if !saw_work {
            assert_eq!(woke, Some(0), "work published but the only worker sleeps un-notified");
            assert!(Idle::is_notified(&model.words[0]));
        }
    });
}

/// A searching worker makes the notifier skip the wake; the searcher then
/// stops searching and goes to sleep: it must see the work on its last look.
#[test]
fn loom_searcher_hands_off_to_sleep() {
    loom::model(|| {
        let model = Model::new();
        model.idle.start_searching();
        let producer = {
            let model = model.clone();
            thread::spawn(move || model.publish())
        };
        // Search found nothing (the stand-in queue was empty when it looked).
        model.idle.stop_searching();
        let saw_work = model.go_to_sleep(0);
        let woke = producer.join().unwrap();
        assert!(saw_work || woke == Some(0), "work published while searching was lost");
    });
}

/// One publish wakes at most one of two sleepers (no thundering herd), and
/// if both went to sleep without seeing it, exactly one is woken.
#[test]
fn loom_one_publish_wakes_at_most_one() {
    loom::model(|| {
        let model = Model::new();
        let second = {
            let model = model.clone();
            thread::spawn(move || model.go_to_sleep(1))
        };
        let producer = {
            let model = model.clone();
            thread::spawn(move || model.publish())
        };
        let saw0 = model.go_to_sleep(0);
        let saw1 = second.join().unwrap();
        let woke = producer.join().unwrap();
        let notified = (0..2).filter(|&i| Idle::is_notified(&model.words[i])).count();
        assert!(notified <= 1, "one publish woke {notified} workers");
        if !saw0 && !saw1 {
            assert_eq!(notified, 1, "both slept and nobody was woken");
            assert!(woke.is_some());
        }
    });
}

/// A driver wait that blocks until woken (an eventfd under loom: a mutex
/// and a condvar).
struct DriverWait {
    woken: loom::sync::Mutex<bool>,
    cv: loom::sync::Condvar,
}

impl DriverWait {
    fn wait(&self) {
        let mut woken = self.woken.lock().unwrap();
        while !*woken {
            woken = self.cv.wait(woken).unwrap();
        }
        *woken = false;
    }

    fn wake(&self) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_one();
    }
}

/// An `io_park` worker sleeps in the I/O driver, not on its word, while a
/// notifier sets the word: the `IoWaiting` handshake makes sure the
/// worker either sees the word before it blocks or is woken in the
/// driver. Removing the fence in `IoWaiting::enter` (or in `must_wake`)
/// leaves the worker blocked with its word set: loom reports a deadlock.
#[test]
fn loom_io_park_notify() {
    loom::model(|| {
        let word = Arc::new(AtomicU32::new(crate::idle::WAITING));
        let flag = Arc::new(crate::idle::IoWaiting::default());
        let driver = Arc::new(DriverWait {
            woken: loom::sync::Mutex::new(false),
            cv: loom::sync::Condvar::new(),
        });
        let notifier = {
            let (word, flag, driver) = (word.clone(), flag.clone(), driver.clone());
            thread::spawn(move || {
                // What `Idle::notify_one` does to a popped sleeper, then
                // `Shared::wake_io`.
                word.store(crate::idle::NOTIFIED, Ordering::Release);
                if flag.must_wake() {
                    driver.wake();
                }
            })
        };
        // The worker's side (`worker.rs::wait_in_io`).
        if !flag.enter(&word) {
            driver.wait();
            flag.leave();
        }
        assert!(Idle::is_notified(&word), "awake without the notification");
        notifier.join().unwrap();
    });
}
