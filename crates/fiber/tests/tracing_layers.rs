//! A `tracing` layer that yields or parks the calling fiber must work like
//! any other fiber code, and per-fiber spans must close when their fibers
//! end. Each test runs in a child process (the subscriber is global).
//!
//! Before: a layer yielding in `on_enter` with `fiber_spans` suspended the
//! worker's own stack (a segfault); one yielding on the runtime's TRACE or
//! DEBUG events parked a fiber that was PARKING (an illegal transition) or
//! held a job's lock (a deadlock); spans were children of their spawner's
//! and stayed open down a whole relay chain (and overflowed a worker's
//! stack when the chain closed).

mod common;
use common::*;

use tracing::span::Id;
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Yields the calling fiber in `on_enter` (a layer that, say, takes a
/// contended `fiber::sync::Mutex` to write a record parks the same way).
struct YieldOnEnter;
impl<S: Subscriber> Layer<S> for YieldOnEnter {
    fn on_enter(&self, _: &Id, _: Context<'_, S>) {
        if fiber::core::in_fiber() {
            let _ = fiber::yield_now();
        }
    }
}

/// Yields the calling fiber in `on_event`: legal for an event logged by
/// the fiber's own code.
struct YieldOnEvent;
impl<S: Subscriber> Layer<S> for YieldOnEvent {
    fn on_event(&self, _: &Event<'_>, _: Context<'_, S>) {
        if fiber::core::in_fiber() {
            let _ = fiber::yield_now();
        }
    }
}

/// Install, for this (child) process, a subscriber whose layer yields the
/// calling fiber on every event at `level` or above.
fn yield_on_events_at(level: tracing_subscriber::filter::LevelFilter) {
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(YieldOnEvent).with(level)).unwrap();
}

/// Per-fiber spans + a layer that yields in on_enter: the runtime enters
/// the span on the worker's stack while `current` is the fiber.
#[test]
fn fiber_span_on_enter_that_yields() {
    in_child("fiber_span_on_enter_that_yields", 30, || {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(YieldOnEnter)).unwrap();
        let rt = fiber::Runtime::builder().workers(1).fiber_spans(true).build().unwrap();
        let v = rt.block_on(|| fiber::spawn(|| 5).join().unwrap());
        assert_eq!(v, 5);
    });
}

/// No per-fiber spans: a layer that yields on events (user events are
/// fine), at TRACE level; fiber-jobs logs JOB_WAIT_REGISTER from inside
/// `Waitable::publish`, while the fiber is PARKING.
#[test]
fn layer_yielding_on_trace_events_and_a_scope_join() {
    in_child("layer_yielding_on_trace_events_and_a_scope_join", 30, || {
        yield_on_events_at(tracing_subscriber::filter::LevelFilter::TRACE);
        let rt = fiber::Runtime::builder().workers(1).build().unwrap();
        let v = rt.block_on(|| {
            tracing::info!("user event in a fiber: the layer may yield here");
            fiber::scope(|s| {
                let h = s.spawn(|| {
                    let _ = fiber::sleep(ms(20));
                    5
                });
                h.join().unwrap()
            })
        });
        assert_eq!(v, 5);
    });
}

/// Counts fiber spans opened and closed.
struct CountSpans(
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
);
impl<S: Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>> Layer<S> for CountSpans {
    fn on_new_span(&self, _: &tracing::span::Attributes<'_>, _: &Id, _: Context<'_, S>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn on_close(&self, _: Id, _: Context<'_, S>) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A relay: each fiber spawns its successor (detached) and returns. Every
/// fiber's span should close when that fiber ends (README: "closed when it
/// ends"); a span whose parent is the spawner's span keeps the whole chain
/// open until the last fiber ends.
#[test]
fn relay_chain_spans_close_when_each_fiber_ends() {
    in_child("relay_chain_spans_close_when_each_fiber_ends", 120, || {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let (new, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(CountSpans(new.clone(), closed.clone())),
        )
        .unwrap();
        let n: usize = 5_000;
        let rt = fiber::Runtime::builder().workers(2).fiber_spans(true).build().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (stop_tx, stop_rx) = fiber::chan::bounded::<()>(0);
        fn relay(left: usize, tx: std::sync::mpsc::Sender<()>, stop: fiber::chan::Receiver<()>) {
            if left == 0 {
                tx.send(()).unwrap();
                let _ = stop.recv();
                return;
            }
            drop(fiber::spawn(move || relay(left - 1, tx, stop)));
        }
        let h = rt.handle();
        h.spawn(move || relay(n, tx, stop_rx));
        rx.recv().unwrap();
        std::thread::sleep(ms(200));
        let (opened, closed_now) = (new.load(Ordering::SeqCst), closed.load(Ordering::SeqCst));
        eprintln!("relay: {opened} spans opened, {closed_now} closed while the last fiber lives");
        drop(stop_tx);
        drop(rt);
        eprintln!("relay: {} closed after shutdown", closed.load(Ordering::SeqCst));
        assert!(
            closed_now + 10 >= opened,
            "{opened} fiber spans opened but only {closed_now} closed although all but one fiber ended"
        );
    });
}

/// DEBUG level (the README's suggested setting): fiber-jobs logs "job
/// state" transitions while holding the job's std mutex; a layer that
/// yields there parks the fiber with that lock held.
#[test]
fn layer_yielding_on_debug_job_state_events() {
    in_child("layer_yielding_on_debug_job_state_events", 30, || {
        yield_on_events_at(tracing_subscriber::filter::LevelFilter::DEBUG);
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        let v = rt.block_on(|| {
            let mut total = 0;
            for _ in 0..50 {
                total += fiber::scope(|s| {
                    let a = s.spawn(|| {
                        let _ = fiber::yield_now();
                        1
                    });
                    let b = s.spawn(|| {
                        let _ = fiber::yield_now();
                        1
                    });
                    a.join().unwrap() + b.join().unwrap()
                });
            }
            total
        });
        assert_eq!(v, 100);
    });
}

/// As above, with a cancel: the canceller yields inside the "job state"
/// event, holding the scope job's std mutex, while a child that finishes
/// needs the same lock to report to its parent.
#[test]
fn layer_yielding_on_debug_events_and_a_scope_cancel() {
    in_child("layer_yielding_on_debug_events_and_a_scope_cancel", 30, || {
        yield_on_events_at(tracing_subscriber::filter::LevelFilter::DEBUG);
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        let v = rt.block_on(|| {
            let mut n = 0;
            for _ in 0..20 {
                fiber::scope(|s| {
                    for _ in 0..4 {
                        s.spawn(|| {
                            let _ = fiber::yield_now();
                        });
                    }
                    let _ = fiber::yield_now();
                    s.job().cancel();
                });
                n += 1;
            }
            n
        });
        assert_eq!(v, 20);
    });
}
