//! Loom models of the fiber-sync protocols (`cargo xtask loom fiber-sync`).

mod loom_sync;

use fiber_core::{Publish, WaitResult, Waitable, Waiter};

/// A waitable that keeps a copy of each record it publishes, so that a
/// model's third thread can fire it: the spurious wake a cancel's
/// interrupt gives a fiber's non-cancellable lock wait (loom's thread
/// waiters are never interrupted otherwise).
pub(crate) struct Spy<'a, W> {
    pub(crate) inner: W,
    pub(crate) last: &'a loom::sync::Mutex<Option<Waiter>>,
}

impl<W: Waitable> Waitable for Spy<'_, W> {
    type Io = W::Io;

    fn kind(&self) -> fiber_core::WaitKind {
        self.inner.kind()
    }

    fn try_complete(&self, io: &mut W::Io) -> Option<WaitResult> {
        self.inner.try_complete(io)
    }

    fn publish(&self, waiter: &Waiter, io: &mut W::Io) -> Publish {
        *self.last.lock().unwrap() = Some(waiter.clone());
        self.inner.publish(waiter, io)
    }

    fn unpublish(&self, waiter: &Waiter, io: &mut W::Io) -> Option<WaitResult> {
        self.inner.unpublish(waiter, io)
    }
}

/// Fire the record `last` holds, if any (the spurious wake).
pub(crate) fn fire(last: &loom::sync::Mutex<Option<Waiter>>) {
    let record = last.lock().unwrap().take();
    if let Some(record) = record {
        fiber_core::fiber_wake(&record);
    }
}
