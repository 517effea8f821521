//! The runtime's `tracing` events, captured by a subscriber layer: fiber
//! start/finish at TRACE, job transitions and pool scaling at DEBUG, a
//! deadlock report at WARN; states by name, never by number.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

#[derive(Clone, Debug)]
struct Seen {
    target: String,
    level: Level,
    fields: Vec<(String, String)>,
}

impl Seen {
    fn message(&self) -> &str {
        self.field("message").unwrap_or("")
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(Seen {
            target: event.metadata().target().to_owned(),
            level: *event.metadata().level(),
            fields,
        });
    }
}

impl Capture {
    fn events(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn wait_for(&self, what: &str, pred: impl Fn(&Seen) -> bool) -> Seen {
        let start = Instant::now();
        loop {
            if let Some(e) = self.events().into_iter().find(&pred) {
                return e;
            }
            // Hang detection only: generous on a loaded machine.
            assert!(start.elapsed() < Duration::from_secs(60), "no {what} event");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn runtime_events_have_levels_and_names() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let rt = fiber::Runtime::builder().workers(1).max_workers(2).build().unwrap();
    let handle = rt.handle();
    let (tx, rx) = std::sync::mpsc::channel::<fiber::chan::Sender<()>>();
    let root = std::thread::spawn(move || {
        handle.block_on(|| {
            let named = fiber::Builder::new().name("traced-1").spawn(|| 1).unwrap();
            assert_eq!(named.join().unwrap(), 1);
            // A scope whose child is cancelled: job transitions by name.
            fiber::scope(|s| {
                let child = s.spawn(|| fiber::sleep(Duration::MAX));
                child.cancel();
            });
            // A fiber that runs 60 ms without a yield point on the only
            // worker, with another fiber waiting: the pool grows.
            let spin = fiber::spawn(|| {
                let waiting = fiber::spawn(|| ());
                let start = std::time::Instant::now();
                while start.elapsed() < Duration::from_millis(60) {
                    std::hint::spin_loop();
                }
                waiting
            });
            spin.join().unwrap().join().unwrap();
            // Park the root with nothing else to run: a deadlock report.
            let (wake_tx, wake_rx) = fiber::chan::bounded::<()>(1);
            tx.send(wake_tx).unwrap();
            wake_rx.recv().unwrap();
        })
    });
    let wake = rx.recv().unwrap();
    let deadlock = capture.wait_for("deadlock", |e| e.message().starts_with("deadlock"));
    wake.send(()).unwrap();
    root.join().unwrap();
    drop(rt);

    assert_eq!(deadlock.level, Level::WARN);
    assert_eq!(deadlock.target, "fiber_sched");
    let events = capture.events();
    let started = events
        .iter()
        .find(|e| e.message() == "fiber started" && e.field("name") == Some("Some(\"traced-1\")"))
        .expect("a start event naming the fiber");
    assert_eq!(started.level, Level::TRACE);
    let id = started.field("fiber").unwrap();
    let finished = events
        .iter()
        .find(|e| e.message() == "fiber finished" && e.field("fiber") == Some(id))
        .expect("a finish event for the same fiber");
    assert_eq!(finished.level, Level::TRACE);

    let cancelled = events
        .iter()
        .find(|e| e.message() == "job state" && e.field("to") == Some("Cancelled"))
        .expect("a job transition to Cancelled, by name");
    assert_eq!(cancelled.level, Level::DEBUG);
    assert_eq!(cancelled.target, "fiber_jobs");
    for e in events.iter().filter(|e| e.message() == "job state") {
        for key in ["from", "to"] {
            let v = e.field(key).unwrap();
            assert!(
                v.chars().next().unwrap().is_ascii_uppercase(),
                "{key} is a state name: {v}"
            );
        }
    }
    let grew = events
        .iter()
        .find(|e| e.message() == "worker pool grew")
        .expect("a scale event for the stuck worker");
    assert_eq!(grew.level, Level::DEBUG);
    assert!(grew.field("reason").unwrap().contains("stuck"), "{grew:?}");
    assert!(
        events.iter().all(|e| e.field("detail").is_none()),
        "no opaque detail fields"
    );
}
