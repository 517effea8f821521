//! 002 §4.21 and §Observability: the job trace events JOB_CREATE,
//! JOB_STATE, JOB_CANCEL_REQ, JOB_FINALIZE, JOB_CHILD_ATTACH,
//! JOB_WAIT_REGISTER and JOB_WAIT_WAKE (spec/jobs.md section 4: TRACE
//! events of target `fiber_jobs` with an `event` field, and the DEBUG "job
//! state" event for JOB_STATE). Its own file: the capture is the process's
//! global subscriber.

mod common;
use common::{ms, rt2, within};
use fiber::chan::bounded;
use fiber::Job;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// One captured `fiber_jobs` event: its fields by name.
type Fields = Vec<(String, String)>;

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Fields>>>);

struct Record<'a>(&'a mut Fields);

impl Visit for Record<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "fiber_jobs" {
            return;
        }
        let mut fields = Vec::new();
        event.record(&mut Record(&mut fields));
        self.0.lock().unwrap().push(fields);
    }
}

fn field<'a>(fields: &'a Fields, name: &str) -> Option<&'a str> {
    fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(capture.clone());
        tracing::subscriber::set_global_default(subscriber).unwrap();
        capture
    })
}

/// The names of the events captured for job `id` (the "job state" event
/// counted as JOB_STATE).
fn names_for(id: u64) -> Vec<String> {
    let id = id.to_string();
    capture()
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|f| field(f, "job") == Some(id.as_str()))
        .filter_map(|f| match field(f, "event") {
            Some(name) => Some(name.to_owned()),
            None if field(f, "message") == Some("job state") => Some("JOB_STATE".to_owned()),
            None => None,
        })
        .collect()
}

/// A scoped child job that is created, attached, joined by another fiber
/// (a registered waiter, woken), then ends; and a second child that is
/// cancelled. Returns the two jobs' ids.
fn scenario() -> (u64, u64) {
    capture();
    within(10, || {
        rt2().block_on(|| {
            fiber::scope(|s| {
                let (job_tx, job_rx) = bounded::<Job>(1);
                let (release_tx, release_rx) = bounded::<()>(0);
                s.spawn(move || {
                    job_tx.send(Job::current()).unwrap();
                    release_rx.recv().unwrap();
                });
                let joined = job_rx.recv().unwrap();
                let joiner = {
                    let joined = joined.clone();
                    fiber::spawn(move || joined.join())
                };
                let start = Instant::now();
                while !names_for(joined.id()).iter().any(|n| n == "JOB_WAIT_REGISTER") {
                    assert!(start.elapsed() < Duration::from_secs(5), "the joiner never registered");
                    fiber::sleep(ms(1)).unwrap();
                }
                release_tx.send(()).unwrap();
                joiner.join().unwrap().unwrap();

                let (c_tx, c_rx) = bounded::<Job>(1);
                let cancelled = s.spawn(move || {
                    c_tx.send(Job::current()).unwrap();
                    let _ = fiber::sleep(Duration::from_secs(3600));
                });
                let cancelled_job = c_rx.recv().unwrap();
                cancelled.cancel();
                let _ = cancelled.join();
                (joined.id(), cancelled_job.id())
            })
        })
    })
}

#[test]
fn s4_21_job_events_are_emitted_for_each_step() {
    let (joined, cancelled) = scenario();
    let seen = names_for(joined);
    for name in [
        "JOB_CREATE",
        "JOB_CHILD_ATTACH",
        "JOB_WAIT_REGISTER",
        "JOB_WAIT_WAKE",
        "JOB_STATE",
    ] {
        assert!(seen.iter().any(|n| n == name), "no {name} for the joined job: {seen:?}");
    }
    let seen = names_for(cancelled);
    assert!(
        seen.iter().any(|n| n == "JOB_CANCEL_REQ"),
        "no JOB_CANCEL_REQ for the cancelled job: {seen:?}"
    );
}

// Failed before the fix: no JOB_FINALIZE event is ever emitted (the finalize path only emits the "job state" transition), though 002 §4.21 and spec/jobs.md section 4 list it.
#[test]
fn s4_21_a_finished_job_emits_job_finalize() {
    let (joined, cancelled) = scenario();
    for id in [joined, cancelled] {
        let seen = names_for(id);
        assert!(
            seen.iter().any(|n| n == "JOB_FINALIZE"),
            "no JOB_FINALIZE for job {id}: {seen:?}"
        );
    }
}

/// 002 §4.16 invariant 3 ("Waiters only exist while job non-terminal ...;
/// after detach, `waiters` list is NULL") with §4.13's join ("if
/// is_terminal(s) return"): a join of a job that has ended registers no
/// waiter and returns the final state at once; one made while it runs
/// registers once and is woken once.
#[test]
fn s4_16_inv3_a_join_of_an_ended_job_registers_no_waiter() {
    capture();
    within(10, || {
        rt2().block_on(|| {
            let (job_tx, job_rx) = bounded::<Job>(1);
            fiber::scope(|s| {
                s.spawn(move || job_tx.send(Job::current()).unwrap());
            });
            let ended = job_rx.recv().unwrap();
            assert!(ended.is_completed());
            for _ in 0..3 {
                assert_eq!(ended.join(), Ok(fiber::JobState::Completed));
            }
            let seen = names_for(ended.id());
            assert!(
                !seen.iter().any(|n| n == "JOB_WAIT_REGISTER" || n == "JOB_WAIT_WAKE"),
                "a join of an ended job registered a waiter: {seen:?}"
            );
        })
    });
    let (joined, _) = scenario();
    let seen = names_for(joined);
    let count = |name: &str| seen.iter().filter(|n| *n == name).count();
    assert_eq!(count("JOB_WAIT_REGISTER"), 1, "{seen:?}");
    assert_eq!(count("JOB_WAIT_WAKE"), 1, "{seen:?}");
}
