//! [`Builder`]: per-fiber settings, like `std::thread::Builder`.

use crate::{JoinHandle, Scope, ScopedJoinHandle};
use std::io;
use std::sync::Arc;

/// Spawn a fiber with settings, like `std::thread::Builder`: a name (shown
/// by [`current().name()`](crate::FiberHandle::name), the fiber dump, the
/// stall and deadlock reports and [`JoinError`](crate::JoinError)), a stack
/// size and pinning.
///
/// ```
/// fiber::run(|| {
///     let handle = fiber::Builder::new()
///         .name("conn-42")
///         .stack_size(64 * 1024)
///         .spawn(|| fiber::current().name().map(str::to_owned))
///         .unwrap();
///     assert_eq!(handle.join().unwrap().as_deref(), Some("conn-42"));
/// });
/// ```
///
/// # Stack size
///
/// A fiber runs on a stack of the runtime's size
/// (`fiber::runtime::Builder::stack_size`, 256 KiB by default, 1 MiB in a
/// build with debug assertions) taken from
/// its frame pool. A `stack_size` at or below it is satisfied by the pool's
/// stack; a larger one (up to 1 GiB) gets a stack mapped for this fiber,
/// guarded like the others, at the spawn. A `Builder` takes a pool stack at
/// the spawn as well, so that a stack that cannot be mapped is the spawn's
/// error (a fiber of [`spawn`](crate::spawn) takes its stack when it first
/// runs). When the fiber ends the pool keeps
/// that stack (up to 64 such) for a later spawn that asks for as much, and
/// unmaps it when it trims idle memory. Above 1 GiB the spawn fails with
/// [`io::ErrorKind::InvalidInput`].
///
/// ```
/// fiber::run(|| {
///     // 8 MiB of stack for deep recursion, more than the runtime gives.
///     let deep = fiber::Builder::new()
///         .stack_size(8 << 20)
///         .spawn(|| {
///             fn depth(n: u64) -> u64 {
///                 let pad = std::hint::black_box([0u8; 512]);
///                 if n == 0 { pad[0] as u64 } else { 1 + depth(n - 1) }
///             }
///             depth(4_000)
///         })
///         .unwrap();
///     assert_eq!(deep.join().unwrap(), 4_000);
/// });
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a Builder does nothing until `spawn` is called"]
pub struct Builder {
    name: Option<Arc<str>>,
    stack_size: Option<usize>,
    pinned: bool,
}

impl Builder {
    /// A builder with no name, the runtime's stack size and no pinning.
    pub fn new() -> Builder {
        Builder::default()
    }

    /// Name the fiber.
    pub fn name(mut self, name: impl Into<String>) -> Builder {
        self.name = Some(Arc::from(name.into()));
        self
    }

    /// The stack size the fiber needs, in bytes (see "Stack size").
    pub fn stack_size(mut self, bytes: usize) -> Builder {
        self.stack_size = Some(bytes);
        self
    }

    /// Pin the fiber: once it has run, it resumes only on the worker
    /// thread it first ran on (see [`spawn_pinned`](crate::spawn_pinned)).
    pub fn pinned(mut self, pinned: bool) -> Builder {
        self.pinned = pinned;
        self
    }

    /// Spawn `f` on the current runtime.
    ///
    /// # Errors
    ///
    /// Fails if the stack size is above 1 GiB (kind `InvalidInput`), or if
    /// the fiber's stack cannot be mapped: a fiber spawned by a `Builder`
    /// takes its stack at the spawn, so that this is the spawn's error, as
    /// with `std::thread::Builder::spawn` (a [`spawn`](crate::spawn)ed
    /// fiber takes its stack when it first runs, and one whose stack cannot
    /// be mapped then never runs: its join reports that as its panic;
    /// `spec/lifecycle.md` section 8). While the runtime shuts down, a spawn from
    /// one of its own fibers succeeds, but the child is cancelled before it
    /// starts (its closure is dropped, its join reports `Cancelled`); spawns
    /// from outside the runtime are refused then
    /// ([`Handle::try_spawn`](crate::Handle::try_spawn) fails).
    ///
    /// # Panics
    ///
    /// Panics outside a fiber (use [`Handle::spawn`](crate::Handle::spawn)
    /// from a plain thread), and if the name contains a NUL byte (as
    /// `std::thread::Builder::spawn` does).
    #[track_caller]
    pub fn spawn<F, T>(self, f: F) -> io::Result<JoinHandle<T>>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let Some(sched) = fiber_core::current_scheduler() else {
            crate::outside("Builder::spawn")
        };
        fiber_core::try_spawn_with(&sched, self.options(), f)
    }

    /// Spawn `f` as a child of `scope`, like `std::thread::Builder::spawn_scoped`
    /// (from a fiber or from a plain thread that borrows the scope).
    ///
    /// ```
    /// fiber::run(|| {
    ///     let mut hits = 0;
    ///     fiber::scope(|s| {
    ///         fiber::Builder::new().name("counter").spawn_scoped(s, || hits += 1).unwrap();
    ///     });
    ///     assert_eq!(hits, 1);
    /// });
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Builder::spawn`].
    #[track_caller]
    pub fn spawn_scoped<'scope, 'env, F, T>(
        self,
        scope: &'scope Scope<'scope, 'env>,
        f: F,
    ) -> io::Result<ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        scope.try_spawn_with(self.options(), f)
    }

    #[track_caller]
    fn options(self) -> fiber_core::SpawnOptions {
        // std's rule (`std::thread::Builder::spawn` panics so): code ported
        // from threads keeps its check, although a fiber's name never
        // reaches the OS.
        if self.name.as_deref().is_some_and(|name| name.contains('\0')) {
            panic!("fiber name may not contain interior null bytes");
        }
        fiber_core::SpawnOptions {
            name: self.name,
            pinned: self.pinned,
            stack_size: self.stack_size,
            // `Builder::spawn` reports a stack that cannot be mapped as its
            // error, as `std::thread::Builder::spawn` does a thread.
            stack_now: true,
            starts_in_shutdown: false,
        }
    }
}
