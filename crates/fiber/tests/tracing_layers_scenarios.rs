//! Per-fiber spans with a subscriber whose layer locks a `fiber::sync`
//! mutex, yields, spawns or sends on a fiber channel, over scoped children,
//! sleeps and cancellations. Each scenario in a child process (the
//! subscriber is global). Span enter/exit callbacks run on the worker,
//! outside any fiber, so there a fiber primitive acts as on a plain thread.

mod common;
use common::*;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// on_event locks a shared fiber::sync::Mutex (the README's advice
    /// for locks in fiber code), contended; on_enter/on_exit, which run on
    /// the worker thread between fibers, lock a std mutex (the README:
    /// a `fiber::sync` lock there blocks the worker thread, and when the
    /// lock is handed to a fiber that needs that worker, every worker can
    /// end up blocked: this scenario hung about once in a few hundred runs
    /// under a loaded machine with the fiber mutex there).
    FiberMutex,
    /// on_enter calls fiber::yield_now() when in a fiber.
    Yield,
    /// on_event spawns a fiber and detaches it.
    SpawnOnEvent,
    /// on_event sends to a bounded(0) fiber channel drained by a fiber.
    ChanOnEvent,
}

struct L {
    mode: Mode,
    lock: Arc<fiber::sync::Mutex<Vec<u64>>>,
    worker_lock: Arc<std::sync::Mutex<Vec<u64>>>,
    enters: Arc<AtomicUsize>,
    events: Arc<AtomicUsize>,
    tx: Option<fiber::chan::Sender<u64>>,
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for L {
    fn on_new_span(&self, _: &Attributes<'_>, _: &Id, _: Context<'_, S>) {}
    fn on_enter(&self, id: &Id, _: Context<'_, S>) {
        self.enters.fetch_add(1, Ordering::Relaxed);
        match self.mode {
            Mode::FiberMutex => {
                let mut g = self.worker_lock.lock().unwrap();
                g.push(id.into_u64());
                if g.len() > 1000 {
                    g.clear();
                }
            }
            Mode::Yield if fiber::Handle::try_current().is_some() && fiber::core::in_fiber() => {
                let _ = fiber::yield_now();
            }
            _ => {}
        }
    }
    fn on_exit(&self, id: &Id, _: Context<'_, S>) {
        if self.mode == Mode::FiberMutex {
            let mut g = self.worker_lock.lock().unwrap();
            g.push(id.into_u64());
        }
    }
    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        let n = self.events.fetch_add(1, Ordering::Relaxed);
        match self.mode {
            Mode::SpawnOnEvent if fiber::core::in_fiber() => {
                drop(fiber::spawn(move || n));
            }
            Mode::ChanOnEvent if fiber::core::in_fiber() => {
                if let Some(tx) = &self.tx {
                    let _ = tx.send(n as u64);
                }
            }
            Mode::FiberMutex if fiber::core::in_fiber() => {
                // Contended by the fibers' events on both workers; never
                // held across a park.
                let mut g = self.lock.lock().unwrap();
                g.push(n as u64);
                if g.len() > 1000 {
                    g.clear();
                }
            }
            Mode::FiberMutex => {
                // The runtime's own events (TRACE) come from its worker
                // and monitor threads, outside any fiber: a std mutex
                // there, as in `on_enter` (README). With the fiber mutex
                // here, a lock handed to a starving fiber waiter while
                // both workers blocked on it in their own events left
                // nobody to run that fiber (hung about once in 50 runs
                // on a loaded machine).
                let mut g = self.worker_lock.lock().unwrap();
                g.push(n as u64);
            }
            _ => {}
        }
    }
}

fn scenario(mode: Mode) {
    let lock = Arc::new(fiber::sync::Mutex::new(Vec::new()));
    let enters = Arc::new(AtomicUsize::new(0));
    let events = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = fiber::chan::bounded::<u64>(0);
    let layer = L {
        mode,
        lock: lock.clone(),
        worker_lock: Arc::new(std::sync::Mutex::new(Vec::new())),
        enters: enters.clone(),
        events: events.clone(),
        tx: (mode == Mode::ChanOnEvent).then(|| tx.clone()),
    };
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(layer)
            .with(tracing_subscriber::filter::LevelFilter::TRACE),
    )
    .unwrap();
    let rt = fiber::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .fiber_spans(true)
        .shutdown_timeout(ms(200))
        .build()
        .unwrap();
    let total = rt.block_on(move || {
        let drain = fiber::spawn(move || {
            let mut n = 0u64;
            while rx.recv().is_ok() {
                n += 1;
            }
            n
        });
        let sum = fiber::scope(|s| {
            let hs: Vec<_> = (0..200u64)
                .map(|i| {
                    s.spawn(move || {
                        for k in 0..5 {
                            tracing::info!(i, k, "tick");
                            let _ = fiber::yield_now();
                        }
                        if i % 7 == 0 {
                            let _ = fiber::sleep(ms(1));
                        }
                        i
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        // Cancelled fibers with spans.
        let hs: Vec<_> = (0..50)
            .map(|_| {
                fiber::spawn(|| {
                    tracing::info!("before");
                    let _ = fiber::sleep(std::time::Duration::from_secs(5));
                    tracing::info!("after");
                })
            })
            .collect();
        let _ = fiber::sleep(ms(5));
        for h in &hs {
            h.cancel();
        }
        for h in hs {
            let _ = h.join();
        }
        // The layer keeps a sender for good (the subscriber is global), so
        // the drain never sees the channel close: the runtime's shutdown
        // cancels it.
        drop(tx);
        drop(drain);
        sum
    });
    assert_eq!(total, (0..200u64).sum::<u64>());
    drop(rt);
    assert!(enters.load(Ordering::Relaxed) > 0);
}

#[test]
fn layer_locks_a_fiber_mutex() {
    in_child("layer_locks_a_fiber_mutex", 60, || scenario(Mode::FiberMutex));
}

#[test]
fn layer_yields_in_on_enter() {
    in_child("layer_yields_in_on_enter", 60, || scenario(Mode::Yield));
}

#[test]
fn layer_spawns_on_event() {
    in_child("layer_spawns_on_event", 60, || scenario(Mode::SpawnOnEvent));
}

#[test]
fn layer_sends_on_a_fiber_channel_on_event() {
    in_child("layer_sends_on_a_fiber_channel_on_event", 60, || {
        scenario(Mode::ChanOnEvent)
    });
}
