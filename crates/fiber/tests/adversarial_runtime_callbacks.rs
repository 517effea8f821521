//! User code that the runtime calls on its own threads, outside any
//! fiber, and that panics: an `on_thread_stop` hook, a tracing layer's
//! callbacks for a fiber's span or for the runtime's own events. None of
//! it may kill a worker or the monitor without its bookkeeping (a worker
//! counted alive with no thread, a fiber RUNNING for good, a monitor gone
//! for the runtime's life). Each tracing scenario runs in a child process
//! (the subscriber is global).

mod common;
use common::{in_child, ms};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tracing::span::Id;
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Threads of this process whose name is `prefix` followed by a number.
fn live_threads(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|n| {
            n.strip_prefix(prefix)
                .is_some_and(|r| r.trim().parse::<usize>().is_ok())
        })
        .count()
}

/// The workers the runtime counts and the worker threads alive with
/// `prefix`, once they agree or after 3 s: a worker that is starting (counted,
/// its thread not yet named) or retiring makes them differ for a moment; a
/// worker counted without a thread for good never agrees.
fn counted_and_live(rt: &fiber::Runtime, prefix: &str) -> (usize, usize) {
    let start = Instant::now();
    loop {
        let (counted, live) = (rt.stats().workers, live_threads(prefix));
        if counted == live || start.elapsed() > Duration::from_secs(3) {
            return (counted, live);
        }
        std::thread::sleep(ms(5));
    }
}

fn spinners(rt: &fiber::Runtime, n: usize, each: Duration) {
    let hs: Vec<_> = (0..n)
        .map(|_| {
            rt.spawn(move || {
                let t = Instant::now();
                while t.elapsed() < each {}
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
}

/// A panicking `on_thread_stop` at retirement: the worker is still gone
/// from the books (it stayed counted: `stats().workers` 3 with one thread,
/// and the pool never grew again).
#[test]
fn a_panicking_on_thread_stop_does_not_leave_ghost_workers() {
    in_child("a_panicking_on_thread_stop_does_not_leave_ghost_workers", 60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(3)
            .idle_timeout(ms(50))
            .thread_name("ghost")
            .on_thread_stop(|| panic!("stop hook"))
            .build()
            .unwrap();
        spinners(&rt, 3, ms(150));
        // The grown workers retire (idle), their hook panics.
        let deadline = Instant::now() + Duration::from_secs(20);
        while live_threads("ghost-") > 1 && Instant::now() < deadline {
            std::thread::sleep(ms(20));
        }
        std::thread::sleep(ms(200));
        let (counted, live) = counted_and_live(&rt, "ghost-");
        assert_eq!(counted, live, "workers counted without a thread");
        let before = rt.stats().scale_ups;
        spinners(&rt, 3, ms(150));
        assert!(rt.stats().scale_ups > before, "the pool could not grow again");
        // The runtime stops with it (its own hook panics once more).
    });
}

static ENTERS: AtomicUsize = AtomicUsize::new(0);

/// A layer whose third `on_enter` panics.
struct PanicOnThirdEnter;
impl<S: Subscriber> Layer<S> for PanicOnThirdEnter {
    fn on_enter(&self, _: &Id, _: Context<'_, S>) {
        if ENTERS.fetch_add(1, Ordering::SeqCst) == 2 {
            panic!("layer bug");
        }
    }
}

/// Run `body` in `rt.block_on` on a plain thread; `None` if it did not
/// return within `secs`.
fn block_on_within<T: Send + 'static>(
    rt: &fiber::Runtime,
    secs: u64,
    body: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let h = rt.handle();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(h.block_on(body));
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

/// A panic in `on_enter` of a fiber's span (entered by the worker around
/// each resume) killed the worker; the fiber stayed RUNNING and its
/// joiner hung. Now the fiber runs without its span entered.
#[test]
fn a_layer_panicking_when_a_fibers_span_is_entered() {
    in_child("a_layer_panicking_when_a_fibers_span_is_entered", 60, || {
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(PanicOnThirdEnter)).unwrap();
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .fiber_spans(true)
            .shutdown_timeout(ms(200))
            .build()
            .unwrap();
        let sum = block_on_within(&rt, 10, || {
            let hs: Vec<_> = (0..20u64).map(|i| fiber::spawn(move || i)).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
        });
        assert_eq!(sum, Some((0..20).sum()), "block_on hung (or a join failed)");
        assert!(ENTERS.load(Ordering::SeqCst) > 3);
    });
}

static EVENTS: AtomicUsize = AtomicUsize::new(0);

/// A layer that panics once on the runtime event whose message contains
/// its text.
struct PanicOnceOnEvent(&'static str);
impl<S: Subscriber> Layer<S> for PanicOnceOnEvent {
    fn on_event(&self, e: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Msg(String);
        impl tracing::field::Visit for Msg {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut m = Msg(String::new());
        e.record(&mut m);
        if m.0.contains(self.0) && EVENTS.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("layer bug on {:?}", m.0);
        }
    }
}

fn event_scenario(which: &'static str) {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(PanicOnceOnEvent(which))
            .with(tracing_subscriber::filter::LevelFilter::TRACE),
    )
    .unwrap();
    let rt = fiber::Runtime::builder()
        .workers(1)
        .max_workers(2)
        .idle_timeout(ms(50))
        .thread_name("cb")
        .shutdown_timeout(ms(200))
        .build()
        .unwrap();
    let failed = block_on_within(&rt, 20, || {
        // Two spinners make the pool grow.
        let hs: Vec<_> = (0..2)
            .map(|_| {
                fiber::spawn(|| {
                    let t = Instant::now();
                    while t.elapsed() < ms(100) {}
                })
            })
            .collect();
        let hs2: Vec<_> = (0..20).map(|i| fiber::spawn(move || i)).collect();
        hs.into_iter().for_each(|h| h.join().unwrap());
        hs2.into_iter()
            .map(|h| h.join().is_err())
            .filter(|failed| *failed)
            .count()
    });
    assert_eq!(
        failed,
        Some(0),
        "block_on hung (or joins failed) after the layer panicked on {which:?}"
    );
    assert!(EVENTS.load(Ordering::SeqCst) >= 1, "the event {which:?} was emitted");
    let (counted, live) = counted_and_live(&rt, "cb-");
    assert_eq!(counted, live, "workers counted without a thread");
    // The monitor still works: once the grown worker has retired, spinners
    // make the pool grow again (the monitor decides growth).
    let deadline = Instant::now() + Duration::from_secs(20);
    while rt.stats().workers > 1 && Instant::now() < deadline {
        std::thread::sleep(ms(20));
    }
    let before = rt.stats().scale_ups;
    spinners(&rt, 2, ms(300));
    assert!(
        rt.stats().scale_ups > before,
        "the pool no longer grows: the monitor died"
    );
}

/// The runtime's TRACE event at a fiber's first run (on the worker).
#[test]
fn a_layer_panicking_on_the_fiber_started_event() {
    in_child("a_layer_panicking_on_the_fiber_started_event", 60, || {
        event_scenario("fiber started")
    });
}

/// The monitor's DEBUG event when the pool grows (it killed the monitor).
#[test]
fn a_layer_panicking_on_the_pool_grew_event() {
    in_child("a_layer_panicking_on_the_pool_grew_event", 60, || {
        event_scenario("worker pool grew")
    });
}

/// As tokio declares them: a runtime, its handle and a join handle can be
/// used across `catch_unwind` without `AssertUnwindSafe`.
#[test]
fn runtime_handle_and_join_handle_are_unwind_safe() {
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    unwind_safe::<fiber::Runtime>();
    unwind_safe::<fiber::Handle>();
    unwind_safe::<fiber::JoinHandle<u32>>();
    let rt = fiber::Runtime::builder().workers(1).build().unwrap();
    let r = std::panic::catch_unwind(|| rt.block_on(|| panic!("inside")));
    assert!(r.is_err());
    assert_eq!(rt.block_on(|| 5), 5);
}
