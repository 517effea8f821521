//! Adversarial: a `tracing` layer that panics on a scope's own
//! CANCELLING event, made by the runtime itself (a scope closing after its
//! body panicked or returned an error, a child's failure handed up). The
//! panic was raised out of the step that made the cancel: a closing scope
//! unwound before joining its children, which still borrowed the scope
//! owner's stack (a use after free in safe code), and a failure handed up
//! skipped the step that ends the child's job, so the scope waited for
//! ever. Such callbacks are now contained (reported on stderr), as every
//! callback the runtime makes on its own is (spec/lifecycle.md section
//! 10). Each test installs the global subscriber in a child process.

use crate::common::*;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The job whose next CANCELLING event panics (0: none).
static TARGET: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Fields {
    message: String,
    to: String,
    job: u64,
}

impl Visit for Fields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "job" {
            self.job = value;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "to" => self.to = format!("{value:?}"),
            _ => {}
        }
    }
}

struct PanicOnCancelling;

impl<S: Subscriber> Layer<S> for PanicOnCancelling {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if meta.target() != "fiber_jobs" || *meta.level() != Level::DEBUG {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if f.message != "job state" || f.to != "Cancelling" || f.job == 0 {
            return;
        }
        if TARGET.compare_exchange(f.job, 0, SeqCst, SeqCst).is_ok() {
            panic!("the layer panicked on job {}'s CANCELLING event", f.job);
        }
    }
}

fn install() {
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(PanicOnCancelling)
            .with(tracing_subscriber::filter::LevelFilter::DEBUG),
    )
    .unwrap();
}

/// A child that goes on for a while after its scope is cancelled, then
/// marks `ended` (on the scope owner's stack).
fn lingering_child(ended: &AtomicBool) {
    let _ = fiber::non_cancellable(|| fiber::sleep(ms(500)));
    ended.store(true, SeqCst);
}

/// A scope body panics; the scope's cancel (made by the runtime as the
/// scope closes) meets the panicking layer. The scope must still wait for
/// its child before it unwinds.
// Failed before the fix: the scope unwound with its child still running (ended == false)
#[test]
fn a_layer_panic_as_a_panicking_scope_closes_still_waits_for_its_children() {
    in_child(
        "a_layer_panic_as_a_panicking_scope_closes_still_waits_for_its_children",
        30,
        || {
            install();
            let rt = rt2();
            rt.block_on(|| {
                let ended = AtomicBool::new(false);
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::scope(|s| {
                        s.spawn(|| lingering_child(&ended));
                        TARGET.store(s.job().id(), SeqCst);
                        panic!("the scope body panics");
                    })
                }));
                assert!(r.is_err(), "the scope re-raised a panic");
                assert!(ended.load(SeqCst), "the scope unwound while its child still ran");
            });
            assert_eq!(TARGET.load(SeqCst), 0, "the layer fired");
        },
    );
}

/// The same with `try_scope` whose body returns an error: no panic at all
/// in user code, only the layer's.
// Failed before the fix: the try_scope unwound with its child still running (ended == false)
#[test]
fn a_layer_panic_as_a_failed_try_scope_closes_still_waits_for_its_children() {
    in_child(
        "a_layer_panic_as_a_failed_try_scope_closes_still_waits_for_its_children",
        30,
        || {
            install();
            let rt = rt2();
            rt.block_on(|| {
                let ended = AtomicBool::new(false);
                let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    fiber::try_scope(|s| -> Result<(), &'static str> {
                        s.spawn(|| {
                            lingering_child(&ended);
                            Ok(())
                        });
                        TARGET.store(s.job().id(), SeqCst);
                        Err("the body failed")
                    })
                }));
                assert!(ended.load(SeqCst), "the try_scope unwound while its child still ran");
                assert_eq!(
                    r.ok(),
                    Some(Err("the body failed")),
                    "the body's error is the scope's outcome"
                );
            });
            assert_eq!(TARGET.load(SeqCst), 0, "the layer fired");
        },
    );
}

/// A child panics and its failure is handed up to the scope; the layer
/// panics on the scope's CANCELLING event, inside the child's finish. The
/// child's job must still end, so the scope closes and re-raises the
/// child's panic.
// Failed before the fix: hang: the scope waited for ever for the child whose job never ended
#[test]
fn a_layer_panic_as_a_childs_failure_is_handed_up_does_not_hang_the_scope() {
    in_child(
        "a_layer_panic_as_a_childs_failure_is_handed_up_does_not_hang_the_scope",
        30,
        || {
            install();
            let rt = rt2();
            let msg = within(10, move || {
                rt.block_on(|| {
                    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        fiber::scope(|s| {
                            TARGET.store(s.job().id(), SeqCst);
                            s.spawn(|| std::panic::panic_any("the child panics"));
                        })
                    }));
                    let payload = r.expect_err("the scope re-raises its child's panic");
                    payload.downcast_ref::<&str>().copied().unwrap_or("?").to_string()
                })
            });
            assert_eq!(msg, "the child panics");
            assert_eq!(TARGET.load(SeqCst), 0, "the layer fired");
        },
    );
}
