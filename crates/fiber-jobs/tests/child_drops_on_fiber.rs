//! User `Drop` code of a scoped child runs on the child's fiber, inside its
//! job: the value a child returns when its handle is gone, the closure of a
//! child cancelled before it started, and the panic payload of a
//! supervised child nobody joins. None of it may run bare on a worker
//! (where a panicking destructor would kill the worker thread), and none
//! of it may make a stray job. In a file of its own: the job counters are
//! process-wide.

use fiber_jobs::*;
use std::sync::atomic::{AtomicUsize, Ordering};

static ON_FIBER: AtomicUsize = AtomicUsize::new(0);
static OFF_FIBER: AtomicUsize = AtomicUsize::new(0);
static IN_JOB: AtomicUsize = AtomicUsize::new(0);

/// Records where it is dropped; panics there too if asked.
struct Probe {
    panics: bool,
}

impl Drop for Probe {
    fn drop(&mut self) {
        if fiber_core::in_fiber() {
            ON_FIBER.fetch_add(1, Ordering::SeqCst);
        } else {
            OFF_FIBER.fetch_add(1, Ordering::SeqCst);
        }
        if Job::try_current().is_some() {
            IN_JOB.fetch_add(1, Ordering::SeqCst);
        }
        if self.panics && !std::thread::panicking() {
            panic!("probe destructor panics");
        }
    }
}

/// Asks for the running job when its fiber's locals are dropped (after
/// the child's body: there may be no job then, but never a stray one).
#[derive(Default)]
struct Asks;

impl Drop for Asks {
    fn drop(&mut self) {
        let _ = Job::try_current();
    }
}

#[test]
fn child_destructors_run_on_the_fiber_in_the_job_and_make_no_stray_job() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = fiber_sched::Runtime::builder()
            .workers(1)
            .max_workers(1)
            .build()
            .unwrap();
        let counted = rt.block_on(|| {
            // The root fiber's own job, made on first use, is not one of
            // the jobs counted below.
            let _root = Job::current();
            let before = stats();
            // A supervised child panics (with a payload whose destructor
            // panics too) after its handle was dropped.
            supervisor_scope(|s| {
                let (tx, rx) = fiber_chan::bounded::<()>(0);
                let h = s.spawn(move || {
                    let _ = rx.recv();
                    std::panic::panic_any(Probe { panics: true })
                });
                drop(h);
                drop(tx);
            });
            // A child whose handle is gone returns a value.
            scope(|s| {
                let (tx, rx) = fiber_chan::bounded::<()>(0);
                let h = s.spawn(move || {
                    let _ = rx.recv();
                    Probe { panics: false }
                });
                drop(h);
                drop(tx);
            });
            // A child cancelled before it starts drops its closure.
            scope(|s| {
                s.job().cancel();
                let probe = Probe { panics: false };
                let _ = s.spawn(move || drop(probe));
            });
            // A fiber-local whose destructor asks for its job, in a child.
            scope(|s| {
                s.spawn(|| {
                    static KEY: u8 = 0;
                    fiber_core::with_fiber_local(&KEY as *const u8 as usize, Asks::default, |_| ());
                });
            });
            // The worker is still alive and runs new fibers.
            assert_eq!(fiber_core::spawn(|| 1).join().unwrap(), 1);
            let after = stats();
            let created = after.jobs_created - before.jobs_created;
            let ended = (after.jobs_completed - before.jobs_completed)
                + (after.jobs_failed - before.jobs_failed)
                + (after.jobs_cancelled - before.jobs_cancelled);
            (created, ended)
        });
        done_tx.send(counted).unwrap();
    });
    let (created, ended): (u64, u64) = done_rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("the runtime hung: a destructor killed its worker"));
    // Four scopes with one child each.
    assert_eq!(created, 8, "no stray job was made");
    assert_eq!(ended, created, "every job ended");
    assert_eq!(
        OFF_FIBER.load(Ordering::SeqCst),
        0,
        "no destructor ran bare on a worker"
    );
    assert_eq!(ON_FIBER.load(Ordering::SeqCst), 3);
    assert_eq!(IN_JOB.load(Ordering::SeqCst), 3, "each ran inside the child's job");
}
