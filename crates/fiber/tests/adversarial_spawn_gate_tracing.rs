//! A tracing layer's `on_new_span` for the per-fiber span (user code) runs
//! in a plain thread's spawn. It must not run while that spawn holds the
//! runtime's spawn gate (`fiber-core/src/gate.rs`): teardown waits on the
//! gate, so a callback that waits for a lock the thread dropping the
//! runtime holds made `Runtime::drop` wait for ever. The span is now made
//! before the gate is taken. (Its own process: it installs a global
//! subscriber.)
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

static LOG: Mutex<()> = Mutex::new(());
static IN_SPAN: AtomicBool = AtomicBool::new(false);

struct Blocking;
impl<S: Subscriber> Layer<S> for Blocking {
    fn on_new_span(&self, attrs: &Attributes<'_>, _id: &Id, _ctx: Context<'_, S>) {
        if attrs.metadata().name() == "fiber" && std::thread::current().name() == Some("spawner") {
            IN_SPAN.store(true, Ordering::SeqCst);
            drop(LOG.lock().unwrap()); // a logger's lock
        }
    }
}

#[test]
fn runtime_drop_waits_for_a_spawn_blocked_in_a_span_callback() {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Blocking)).unwrap();
    let rt = fiber::runtime::Builder::new()
        .workers(1)
        .fiber_spans(true)
        .shutdown_timeout(Duration::from_millis(100))
        .build()
        .unwrap();
    let handle = rt.handle();
    // The dropping thread holds the logger's lock while it drops the runtime.
    let guard = LOG.lock().unwrap();
    let spawner = std::thread::Builder::new()
        .name("spawner".into())
        .spawn(move || {
            let _ = handle.try_spawn(|| ());
        })
        .unwrap();
    while !IN_SPAN.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let dropper = std::thread::spawn(move || {
        let t = Instant::now();
        drop(rt);
        d2.store(true, Ordering::SeqCst);
        t.elapsed()
    });
    let start = Instant::now();
    while !done.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let hung = !done.load(Ordering::SeqCst);
    drop(guard);
    if hung {
        // Let it finish now that the lock is free, to show the cause.
        let took = dropper.join().unwrap();
        spawner.join().unwrap();
        panic!("Runtime::drop did not return within 10 s while the spawner sat in on_new_span holding the gate (returned {took:?} after the lock was released)");
    }
    dropper.join().unwrap();
    spawner.join().unwrap();
}
