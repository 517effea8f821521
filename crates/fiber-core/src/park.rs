//! `park` / `unpark` for fibers, after `std::thread::park`: each spawned
//! fiber has one token; `unpark` makes it available (wakes the fiber if it
//! is parked), `park` consumes it or waits for it. Spurious returns are
//! allowed, as in std, and a cancelled fiber's `park` returns at once.

use crate::fiber::{current, FiberId};
use crate::sync::{lock, Mutex};
use crate::task::TaskRef;
use crate::wait::{fiber_wait, fiber_wake, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::fmt;
use std::time::{Duration, Instant};

/// The park token of one fiber (`park` / `unpark`): whether the token is
/// available, and the fiber parked waiting for it. Opaque: a layer that
/// spawns with [`try_spawn_unjoined`](crate::try_spawn_unjoined) keeps one
/// in its per-fiber block and hands it out through
/// [`UnjoinedTask::park_token`](crate::UnjoinedTask::park_token).
#[derive(Default)]
pub struct ParkToken(Mutex<(bool, Option<Waiter>)>);

impl fmt::Debug for ParkToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("ParkToken { .. }")
    }
}

impl ParkToken {
    fn unpark(&self) {
        let waiter = {
            let mut token = lock(&self.0);
            token.0 = true;
            token.1.take()
        };
        if let Some(waiter) = waiter {
            fiber_wake(&waiter);
        }
    }
}

impl Waitable for ParkToken {
    type Io = ();

    fn kind(&self) -> crate::WaitKind {
        crate::WaitKind::Park
    }

    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        let mut token = lock(&self.0);
        std::mem::take(&mut token.0).then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let mut token = lock(&self.0);
        if std::mem::take(&mut token.0) {
            return Publish::Ready(WaitResult::Ok);
        }
        token.1 = Some(waiter.clone());
        Publish::Published
    }

    fn unpublish(&self, _: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let mut token = lock(&self.0);
        token.1 = None;
        std::mem::take(&mut token.0).then_some(WaitResult::Ok)
    }
}

/// A handle to a spawned fiber: its id and its park token.
#[derive(Clone)]
pub struct FiberHandle {
    id: FiberId,
    task: TaskRef,
    name: Option<std::sync::Arc<str>>,
}

// Like `std::thread::Thread`: an id, a name and the park token, whose
// state no panic can leave half-changed.
impl std::panic::UnwindSafe for FiberHandle {}
impl std::panic::RefUnwindSafe for FiberHandle {}

impl FiberHandle {
    /// The handle of a fiber that [`try_spawn_unjoined`](crate::try_spawn_unjoined)
    /// spawned with `task` as its block, for the layer's own join handle
    /// (a scoped child's `fiber()`): `unpark` goes to that block's token.
    pub fn of_unjoined<U: crate::UnjoinedTask>(
        id: FiberId,
        task: std::sync::Arc<U>,
        name: Option<std::sync::Arc<str>>,
    ) -> FiberHandle {
        FiberHandle::new(id, TaskRef::Shared(task), name)
    }

    pub(crate) fn new(id: FiberId, task: TaskRef, name: Option<std::sync::Arc<str>>) -> FiberHandle {
        FiberHandle { id, task, name }
    }

    /// Make the fiber's park token available, waking it if it is parked in
    /// [`park`] (like `std::thread::Thread::unpark`).
    pub fn unpark(&self) {
        self.task.park_token().unpark()
    }

    /// The fiber's id.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// The fiber's name, if it was spawned with one (`fiber::Builder::name`),
    /// like `std::thread::Thread::name`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

impl fmt::Debug for FiberHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FiberHandle")
            .field("id", &self.id)
            .field("name", &self.name)
            .finish()
    }
}

/// The running fiber's handle, or `None` on a plain thread.
pub fn current_handle() -> Option<FiberHandle> {
    let fiber = current::get();
    if fiber.is_null() {
        return None;
    }
    // SAFETY: the running fiber reads its own slots.
    let task = unsafe { (*fiber).task() }?;
    // SAFETY: as above.
    let (id, name) = unsafe { ((*fiber).id(), (*fiber).name()) };
    Some(FiberHandle::new(id, task, name))
}

#[track_caller]
fn park_inner(deadline: Option<Instant>) {
    let Some(handle) = current_handle() else {
        match deadline {
            Some(d) => std::thread::park_timeout(d.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
        return;
    };
    let token = handle.task.park_token();
    let _ = fiber_wait(
        token,
        &mut (),
        WaitOptions::new().deadline(deadline).interrupt(Interrupt::Cancellable),
    );
}

/// Block until the fiber's park token is available, then consume it (like
/// `std::thread::park`). May return spuriously. On a plain thread this is
/// `std::thread::park`.
#[track_caller]
pub fn park() {
    crate::coop_point();
    park_inner(None)
}

/// [`park`] with a timeout (like `std::thread::park_timeout`).
#[track_caller]
pub fn park_timeout(timeout: Duration) {
    crate::coop_point();
    park_inner(Instant::now().checked_add(timeout))
}
