//! Shutdown's wake of the workers against a worker that is going to sleep
//! at that moment.
//!
//! `Runtime::shutdown` (step 3) and a build that failed after its workers
//! started (`stop_started_threads`) store `shutdown = true` and then leave
//! NOTIFIED in every worker's futex word, without the sleepers lock
//! (`Idle::publish_shutdown`). A worker going to sleep stores WAITING in its
//! word, announces itself and fences (`Idle::prepare_sleep`), then reads
//! `shutdown` and, seeing `false` and no work, waits until its word is
//! NOTIFIED. If its WAITING lands after shutdown's NOTIFIED, only its read
//! of `shutdown` can save it: each side is a store then a load on two
//! locations, so each needs its SeqCst fence (PITFALLS 3). Without the
//! fence in `publish_shutdown` this model fails (checked by removing it):
//! the worker sleeps with WAITING in its word and nobody left to wake it.

use crate::idle::{Idle, NOTIFIED};
use crate::sync::{AtomicBool, AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;

struct Model {
    idle: Idle,
    word: AtomicU32,
    shutdown: AtomicBool,
}

/// `worker.rs::sleep` up to its decision: `true` if the worker goes on to
/// wait for its word (it saw no shutdown; this model has no work).
fn go_to_sleep(model: &Model) -> bool {
    model.idle.prepare_sleep(0, &model.word);
    // Acquire: as `Shared::is_shutdown`.
    !model.shutdown.load(Ordering::Acquire)
}

#[test]
fn loom_shutdown_wakes_a_worker_going_to_sleep() {
    loom::model(|| {
        let model = Arc::new(Model {
            idle: Idle::new(1),
            // The word as a worker leaves it after its last wake.
            word: AtomicU32::new(NOTIFIED),
            shutdown: AtomicBool::new(false),
        });
        let stopper = {
            let model = model.clone();
            // (`futex_wake_one` follows in the runtime: a no-op here.)
            thread::spawn(move || Idle::publish_shutdown(&model.shutdown, [&model.word]))
        };
        let sleeps = go_to_sleep(&model);
        stopper.join().unwrap();
        if sleeps {
            assert!(
                Idle::is_notified(&model.word),
                "the worker went to sleep after shutdown with WAITING in its word: nobody wakes it"
            );
        }
    });
}
