//! Loom model of the poller's rest (`rest.rs`): the real `PollerRest`
//! methods, a poller that decides to rest after a harvest, and the last
//! worker going to sleep.

use crate::rest::PollerRest;
use crate::sync::{Arc, AtomicBool, Ordering};
use loom::thread;

/// The worker's harvest happened (so the poller would rest), then the
/// worker goes to sleep while the poller decides. The forbidden outcome:
/// the poller parks and the worker, having seen no rest, does not unpark
/// it (then every worker sleeps and nobody waits for I/O until the rest
/// times out). Replacing either `fence(SeqCst)` with nothing lets loom
/// find that interleaving (store buffering).
#[test]
fn loom_last_worker_to_sleep_never_misses_a_resting_poller() {
    loom::model(|| {
        let rest = Arc::new(PollerRest::default());
        rest.note_harvest();
        let unparked = Arc::new(AtomicBool::new(false));
        let worker = {
            let (rest, unparked) = (rest.clone(), unparked.clone());
            thread::spawn(move || {
                if rest.worker_sleeping() {
                    unparked.store(true, Ordering::Relaxed);
                }
            })
        };
        let parks = rest.begin() == Some(true);
        worker.join().unwrap();
        if parks {
            assert!(
                unparked.load(Ordering::Relaxed),
                "the poller parked and the last worker to sleep did not wake it"
            );
        }
        rest.end();
    });
}
