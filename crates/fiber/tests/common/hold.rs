//! A `tracing` layer that holds a canceller part way through a job's
//! cancel: the fiber that set [`ARMED`] is parked at the next DEBUG event
//! of fiber-jobs it logs (the "job state" change of the job it just turned
//! CANCELLING), before the cancel interrupts the job's fibers or walks its
//! children, until the test releases it. For tests run in a child process
//! (`in_child`): the subscriber is global.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::OnceLock;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Set by the fiber about to cancel; the layer takes it.
pub static ARMED: AtomicBool = AtomicBool::new(false);

/// The held canceller says it is held on `parked`, and waits on `release`.
pub struct Gate {
    pub parked: (fiber::chan::Sender<()>, fiber::chan::Receiver<()>),
    pub release: (fiber::chan::Sender<()>, fiber::chan::Receiver<()>),
}

/// The process's gate.
pub fn gate() -> &'static Gate {
    static GATE: OnceLock<Gate> = OnceLock::new();
    GATE.get_or_init(|| Gate {
        parked: fiber::chan::bounded(1),
        release: fiber::chan::bounded(1),
    })
}

struct HoldCanceller;
impl<S: Subscriber> Layer<S> for HoldCanceller {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if fiber::core::in_fiber()
            && meta.target() == "fiber_jobs"
            && *meta.level() == Level::DEBUG
            && ARMED.swap(false, SeqCst)
        {
            gate().parked.0.send(()).unwrap();
            // Held off: another canceller may reach this fiber's job.
            fiber::non_cancellable(|| gate().release.1.recv()).unwrap();
        }
    }
}

/// Install the holding layer as this (child) process's subscriber.
pub fn install() {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(HoldCanceller)
            .with(tracing_subscriber::filter::LevelFilter::DEBUG),
    )
    .unwrap();
}

/// A panic payload's message.
pub fn message(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}
