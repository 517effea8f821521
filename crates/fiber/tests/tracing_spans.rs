//! Optional per-fiber spans (`runtime::Builder::fiber_spans(true)`,
//! `FIBER_TRACE_SPANS=1`): events logged by a fiber's code sit in a span
//! named `fiber` with the fiber's id and name, across parks and worker
//! changes; the span closes when the fiber ends. In a file of its own: the
//! subscriber and the switch are process-wide.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Default)]
struct Seen {
    /// Span id -> (span name, its fields).
    spans: HashMap<u64, (String, Vec<(String, String)>)>,
    /// (event message, the id of the span it was logged in).
    events: Vec<(String, Option<u64>)>,
    closed: Vec<u64>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

struct Fields<'a>(&'a mut Vec<(String, String)>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.push((field.name().to_owned(), value.to_string()));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Vec::new();
        attrs.record(&mut Fields(&mut fields));
        let name = attrs.metadata().name().to_owned();
        self.0.lock().unwrap().spans.insert(id.into_u64(), (name, fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Fields(&mut fields));
        let message = fields
            .iter()
            .find(|(k, _)| k == "message")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let span = ctx.event_span(event).map(|s| s.id().into_u64());
        self.0.lock().unwrap().events.push((message, span));
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        self.0.lock().unwrap().closed.push(id.into_u64());
    }
}

#[test]
fn each_fiber_runs_in_a_span_with_its_id_and_name() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone())).unwrap();
    let rt = fiber::runtime::Builder::new()
        .workers(2)
        .fiber_spans(true)
        .build()
        .unwrap();
    let id = rt.block_on(|| {
        let handle = fiber::Builder::new()
            .name("span-7")
            .spawn(|| {
                tracing::info!("before the park");
                let _ = fiber::sleep(Duration::from_millis(5));
                tracing::info!("after the park");
                fiber::current().id()
            })
            .unwrap();
        let id = handle.join().unwrap();
        tracing::info!("in the root, after the join");
        id
    });
    drop(rt);
    let seen = capture.0.lock().unwrap();
    let span_of = |message: &str| {
        seen.events
            .iter()
            .find(|(m, _)| m == message)
            .unwrap_or_else(|| panic!("no event {message:?}"))
            .1
    };
    let before = span_of("before the park").expect("the fiber's event is in a span");
    assert_eq!(span_of("after the park"), Some(before), "the same span after a park");
    let (name, fields) = &seen.spans[&before];
    assert_eq!(name, "fiber");
    let field = |key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    assert_eq!(field("name"), Some("span-7"));
    assert_eq!(field("id").map(|v| format!("fiber {v}")), Some(id.to_string()));
    assert_ne!(
        span_of("in the root, after the join"),
        Some(before),
        "the root's event is not in the child's span"
    );
    assert!(seen.closed.contains(&before), "the span closes when the fiber ends");
}
