//! The MUST-NOT rows of the job state machine, driven through the real code
//! paths: every transition the runtime makes is read back from its
//! `tracing` event ("job state", with job, from and to), and each scenario
//! does what would produce a forbidden edge if the code were wrong (cancel
//! a job that ended, a closure that returns after its job was cancelled, a
//! panic after a cancel, repeated cancels, cancel before the body starts).
//! Every recorded edge must be legal (`is_legal`), start from ACTIVE, chain
//! (each `from` is the previous `to`) and stop at the first terminal state.
//! Runs on fiber-core's test scheduler and on fiber-sched.

use fiber_core::testing::TestScheduler;
use fiber_jobs::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Every job transition seen by the process: job id -> [(from, to)].
type Edges = Arc<Mutex<HashMap<u64, Vec<(JobState, JobState)>>>>;

fn edges() -> &'static Edges {
    static EDGES: OnceLock<Edges> = OnceLock::new();
    EDGES.get_or_init(|| {
        let edges = Edges::default();
        let layer = Capture(edges.clone());
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
        edges
    })
}

struct Capture(Edges);

#[derive(Default)]
struct Fields {
    message: String,
    job: Option<u64>,
    from: String,
    to: String,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "job" {
            self.job = Some(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        match field.name() {
            "message" => self.message = text,
            "from" => self.from = text,
            "to" => self.to = text,
            "job" => self.job = text.parse().ok(),
            _ => {}
        }
    }
}

fn parse_state(name: &str) -> JobState {
    match name {
        "Active" => JobState::Active,
        "Cancelling" => JobState::Cancelling,
        "Cancelled" => JobState::Cancelled,
        "Completed" => JobState::Completed,
        "Failed" => JobState::Failed,
        other => panic!("job state event with an unknown state name {other:?}"),
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "fiber_jobs" {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        if fields.message != "job state" {
            return;
        }
        let job = fields.job.expect("a job state event names its job");
        let edge = (parse_state(&fields.from), parse_state(&fields.to));
        self.0.lock().unwrap().entry(job).or_default().push(edge);
    }
}

/// The edges recorded for `job`, after checking them against the matrix.
fn path_of(job: u64) -> Vec<(JobState, JobState)> {
    let path = edges().lock().unwrap().get(&job).cloned().unwrap_or_default();
    let mut at = JobState::Active;
    for &(from, to) in &path {
        assert_eq!(
            from, at,
            "job {job}: edge {from:?} -> {to:?} does not start where the last ended ({path:?})"
        );
        let legal = [JobActor::Canceller, JobActor::Finalizer]
            .into_iter()
            .any(|actor| is_legal(from, to, actor));
        assert!(legal, "job {job}: illegal edge {from:?} -> {to:?} taken ({path:?})");
        at = to;
    }
    path
}

use JobState::{Active, Cancelled, Cancelling, Completed, Failed};

fn on_both(scenario: fn()) {
    edges();
    TestScheduler::new().block_on(scenario);
    TestScheduler::with_seed(0x5EED).block_on(scenario);
    let rt = fiber_sched::Runtime::builder().workers(2).build().unwrap();
    rt.block_on(scenario);
}

/// Cancel of a job that has ended (COMPLETED, CANCELLED, FAILED -> anything
/// is a MUST-NOT): no edge is taken, the state and reason stay.
#[test]
fn cancel_after_the_end_takes_no_edge() {
    on_both(|| {
        let (done, cancelled, failed) = supervisor_scope(|s| {
            let done = s.spawn(|| Job::current());
            let done = done.join().unwrap();
            let cancelled = {
                let (tx, rx) = std::sync::mpsc::channel();
                let h = s.spawn(move || {
                    let me = Job::current();
                    tx.send(me.clone()).unwrap();
                    me.cancel();
                });
                assert!(h.join().unwrap_err().is_cancelled());
                rx.recv().unwrap()
            };
            let (tx, rx) = std::sync::mpsc::channel();
            let h = s.spawn(move || {
                tx.send(Job::current()).unwrap();
                panic!("expected by the test")
            });
            assert!(h.join().unwrap_err().is_panic());
            (done, cancelled, rx.recv().unwrap())
        });
        for _ in 0..3 {
            done.cancel();
            cancelled.cancel();
            failed.cancel();
        }
        assert_eq!(done.state(), Completed);
        assert_eq!(path_of(done.id()), [(Active, Completed)]);
        assert_eq!(cancelled.state(), Cancelled);
        assert_eq!(path_of(cancelled.id()), [(Active, Cancelling), (Cancelling, Cancelled)]);
        // A failing job cancels its subtree on the way (Kotlin's failing
        // job is "cancelling" too), then ends FAILED.
        assert_eq!(failed.state(), Failed);
        assert_eq!(path_of(failed.id()), [(Active, Cancelling), (Cancelling, Failed)]);
    });
}

/// CANCELLING -> COMPLETED is a MUST-NOT: a closure that returns a value
/// after its job was cancelled ends CANCELLED, and its value is dropped.
#[test]
fn a_value_returned_after_cancel_does_not_complete_the_job() {
    on_both(|| {
        let job = scope(|s| {
            let h = s.spawn(|| {
                let me = Job::current();
                me.cancel();
                // Ignore the cancellation and return a value anyway.
                (me, 7u32)
            });
            match h.join() {
                Err(e) => assert!(e.is_cancelled()),
                Ok(_) => panic!("a job cancelled before it finished joined Ok"),
            }
            s.job()
        });
        // The scope's own job was not cancelled.
        assert_eq!(job.state(), Completed);
        assert_eq!(path_of(job.id()), [(Active, Completed)]);
    });
}

/// ACTIVE -> CANCELLED (skipping CANCELLING) is a MUST-NOT: a child
/// cancelled before its body starts goes through CANCELLING.
#[test]
fn cancel_before_start_passes_through_cancelling() {
    on_both(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let outer = scope(|s| {
            s.job().cancel();
            let h = s.spawn(move || tx.send(Job::current().id()).unwrap());
            assert!(h.join().unwrap_err().is_cancelled());
            s.job()
        });
        assert_eq!(outer.state(), Cancelled);
        assert_eq!(path_of(outer.id()), [(Active, Cancelling), (Cancelling, Cancelled)]);
        // The child's body never ran (so it never sent its id).
        assert!(rx.try_recv().is_err());
    });
}

/// CANCELLING -> CANCELLING (a second request) and a panic after the
/// cancel: one ACTIVE -> CANCELLING edge, then CANCELLING -> FAILED.
#[test]
fn repeated_cancels_then_a_panic_end_failed_once() {
    on_both(|| {
        let job = supervisor_scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let h = s.spawn(move || {
                let me = Job::current();
                tx.send(me.clone()).unwrap();
                for _ in 0..3 {
                    me.cancel();
                }
                assert!(fiber_jobs::is_cancelled());
                panic!("expected by the test: a panic after the cancel")
            });
            assert!(h.join().unwrap_err().is_panic());
            rx.recv().unwrap()
        });
        assert_eq!(job.state(), Failed);
        assert_eq!(path_of(job.id()), [(Active, Cancelling), (Cancelling, Failed)]);
    });
}

/// A non-supervisor parent failed by its child: ACTIVE -> CANCELLING ->
/// FAILED for the parent, never COMPLETED or CANCELLED, and the sibling
/// parked at the time ends CANCELLED through CANCELLING.
#[test]
fn a_failed_child_fails_its_parent_through_cancelling() {
    on_both(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            scope(|s| {
                tx.send(s.job()).unwrap();
                let sibling_tx = tx.clone();
                // The failing child panics only once the sibling runs: a
                // child cancelled before it starts never runs its body (and
                // never sends its job), which a loaded machine produced
                // when the failing child ran first on the other worker.
                let (started_tx, started) = fiber_chan::bounded::<()>(1);
                s.spawn(move || {
                    sibling_tx.send(Job::current()).unwrap();
                    started_tx.send(()).unwrap();
                    // Parked until the failure cancels it.
                    let (_keep, never) = fiber_chan::bounded::<()>(0);
                    let _ = never.recv_timeout(Duration::from_secs(3600));
                });
                s.spawn(move || {
                    started.recv().unwrap();
                    panic!("expected by the test: the failing child")
                });
            })
        }));
        assert!(result.is_err(), "the child's panic is re-raised by the scope");
        let parent = rx.recv().unwrap();
        let sibling = rx.recv().unwrap();
        assert_eq!(parent.state(), Failed);
        assert_eq!(path_of(parent.id()), [(Active, Cancelling), (Cancelling, Failed)]);
        assert_eq!(sibling.state(), Cancelled);
        assert_eq!(path_of(sibling.id()), [(Active, Cancelling), (Cancelling, Cancelled)]);
    });
}

/// Every job any test of this process created took only legal, chained
/// edges and left ACTIVE at most once.
#[test]
fn every_recorded_path_is_legal() {
    on_both(|| {
        scope(|s| {
            for i in 0..50u32 {
                let h = s.spawn(move || {
                    if i % 3 == 0 {
                        Job::current().cancel();
                    }
                    i
                });
                if i % 5 == 0 {
                    h.cancel();
                }
            }
        });
    });
    let jobs: Vec<u64> = edges().lock().unwrap().keys().copied().collect();
    assert!(jobs.len() >= 50, "the scenario's jobs were recorded");
    for job in jobs {
        let path = path_of(job);
        assert!(
            path.iter().filter(|(from, _)| *from == Active).count() <= 1,
            "job {job}: {path:?}"
        );
    }
}
