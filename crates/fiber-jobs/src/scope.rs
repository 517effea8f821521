//! Scopes: `scope`, `try_scope`, `supervisor_scope`, `with_timeout`, the
//! current job, and detached spawns.

use crate::job::{CancelReason, Failure, JobCore, JobState, SharedPayload};
use crate::sync::{lock, Mutex};
use fiber_core::{CancelScope, FiberId, JoinError, SpawnOptions};
use std::any::Any;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The job the running fiber belongs to, as a shareable handle.
#[derive(Clone)]
pub struct Job {
    core: Arc<JobCore>,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("id", &self.core.id)
            .field("state", &self.core.state())
            .finish()
    }
}

impl Job {
    /// The job of the running fiber. Every fiber runs in a job: a scoped
    /// child in its scope's child job, any other fiber in a root job of its
    /// own (made on first use, detached like Kotlin's `GlobalScope.launch`;
    /// `JoinHandle::cancel` cancels it).
    ///
    /// # Panics
    ///
    /// Panics where there is no job (use [`Job::try_current`] in code that
    /// may run there): on a plain thread; in a fiber's code that runs after
    /// its body returned (its fiber-local destructors, the drop of a value
    /// nobody joins), where the fiber's job has ended and is gone, as a
    /// thread's identity is in its thread-local destructors; and in a fiber
    /// that runs in a cancellation scope of another layer. The message says
    /// which.
    #[track_caller]
    pub fn current() -> Job {
        match Job::try_current() {
            Some(job) => job,
            None if !fiber_core::in_fiber() => panic!(
                "fiber::Job::current called outside a fiber: plain threads have no job; use Job::try_current \
                 where the code may run on a thread"
            ),
            None if fiber_core::current_cancel_scope().is_some() => panic!(
                "fiber::Job::current called in a fiber that runs in another layer's cancellation scope: it \
                 has no job of this crate; use Job::try_current there"
            ),
            None => panic!(
                "fiber::Job::current called in a fiber whose body has returned (a fiber-local destructor, or \
                 the drop of a value nobody joins): its job has ended and is gone; use Job::try_current in \
                 code that runs there"
            ),
        }
    }

    /// The job of the running fiber, or `None` where there is none: on a
    /// plain thread, in a fiber's code that runs after its body returned
    /// (fiber-local destructors, the drop of a value nobody joins), or in a
    /// fiber running in another layer's cancellation scope.
    pub fn try_current() -> Option<Job> {
        current_job().map(|core| Job { core })
    }

    /// Request cancellation of this job and its subtree. Fibers parked at
    /// cancellable points (channel operations, `sleep`, waits) are woken and
    /// see `Cancelled`; a fiber that never reaches such a point is not
    /// interrupted. When `cancel` returns, the job and every job below it
    /// are cancelling (or ended) and every fiber parked in them has been
    /// woken, even if another cancel of the job started first and is still
    /// on its way down (as Go's `context` cancel leaves every derived
    /// context done): a fiber inside the job reads
    /// [`is_cancelled`](crate::is_cancelled) as true
    /// right after.
    pub fn cancel(&self) {
        self.core.cancel(CancelReason::Cancelled);
    }

    /// Was the job cancelled for any reason: an explicit cancel, a cancelled
    /// parent, a timeout, or a failure (its own or a child's)? Kotlin's
    /// `isCancelled`: false for a job that is running or completed normally.
    pub fn is_cancelled(&self) -> bool {
        matches!(
            self.core.observed_state(),
            JobState::Cancelling | JobState::Cancelled | JobState::Failed
        )
    }

    /// Cancel the job, then wait until it has ended (Kotlin's
    /// `cancelAndJoin`).
    #[track_caller]
    pub fn cancel_and_join(&self) -> Result<JobState, Cancelled> {
        self.cancel();
        self.join()
    }

    /// The job's state. While a scope's body is done but children still run,
    /// the job is reported `Active` (Kotlin's "completing" is not a separate
    /// state here; see spec/jobs.md). A job past a `with_timeout` deadline
    /// (its own or an ancestor's) is `Cancelling` from that instant, as
    /// [`is_cancelled`] sees it, even before the timer has cancelled it (a
    /// body spinning on the only worker keeps the timer's fiber from
    /// running).
    pub fn state(&self) -> JobState {
        self.core.observed_state()
    }

    /// Is the job still running (not cancelling, not ended, not past a
    /// `with_timeout` deadline)? Kotlin's `isActive`.
    pub fn is_active(&self) -> bool {
        self.core.observed_state() == JobState::Active
    }

    /// Has the job ended (completed, failed or cancelled)? Kotlin's
    /// `isCompleted`.
    pub fn is_completed(&self) -> bool {
        self.core.state().is_terminal()
    }

    /// Wait until the job has ended and return its final state. A
    /// cancellable point that always checks, as Kotlin's `join`: a waiting
    /// fiber that is cancelled (its own job, its task, or its runtime
    /// shutting down) gets `Err(Cancelled)`, whether it was cancelled
    /// before the call or while it waited, and even if this job has already
    /// ended. Inside [`fiber::non_cancellable`](fiber_core::non_cancellable)
    /// the join waits and returns the state, for clean-up code (except once
    /// the runtime's shutdown grace time is over: then nothing waits).
    ///
    /// # Panics
    ///
    /// Panics if the calling fiber runs inside this job (its own job, or a
    /// scope it runs in) and is not cancelled: the job ends only after this
    /// fiber does, so the join would wait for itself (as `JoinHandle::join`
    /// on one's own handle panics). A cancelled fiber gets `Err(Cancelled)`
    /// instead (`cancel_and_join` of its own job).
    #[track_caller]
    pub fn join(&self) -> Result<JobState, Cancelled> {
        // The fiber's operation budget: a loop joining ended jobs lets the
        // fibers beside it run.
        fiber_core::coop_point();
        if fiber_core::is_cancel_requested() {
            // Kotlin's join "always checks for a cancellation of the
            // invoking coroutine's Job", ended job or not (and a fiber
            // cancelled by `cancel_and_join` of its own job ends here too).
            return Err(Cancelled);
        }
        match inside(&self.core) {
            Inside::No => {}
            // A cancellation of this job (or of one between it and the
            // caller) is on its way down to the caller: another canceller
            // is part way through the subtree, and this fiber's own
            // `cancel` found the job cancelling already. The caller is
            // cancelled as surely as once the walk reaches it.
            Inside::Cancelled => return Err(Cancelled),
            Inside::Yes => panic!(
                "fiber::Job::join: the calling fiber (or the fiber whose fiber::blocking call this is) runs \
                 inside the job it joins (its own job or an enclosing scope's), which ends only after that \
                 fiber does; the join would wait for itself"
            ),
        }
        self.core.join().ok_or(Cancelled)
    }

    /// Why the job was cancelled, if it was (`TimedOut` for a job past a
    /// `with_timeout` deadline that nothing cancelled first, as
    /// [`state`](Self::state) reports it).
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.core.observed_reason()
    }

    /// The job's id.
    pub fn id(&self) -> u64 {
        self.core.id
    }

    /// A new job with no fiber of its own: Kotlin's `Job()` (with
    /// `parent`, `Job(parent)`). Fibers are started in it with
    /// [`spawn`](Self::spawn); it stays ACTIVE until [`complete`](Self::complete)
    /// is called or it is cancelled, and then ends once its children have:
    /// COMPLETED, CANCELLED, or FAILED if a child panicked (a child's
    /// failure cancels it and its other children, as in a scope). Given a
    /// `parent`, it is that job's child: cancelled with it, its failure
    /// cancels the parent (unless the parent is a supervisor), and the
    /// parent ends only after it. A job made under a parent that is
    /// cancelling or has ended starts cancelled. Unlike a scope, nothing
    /// waits for it on its own: join it with [`join`](Self::join).
    ///
    /// Usable from any thread; [`spawn`](Self::spawn) needs a fiber.
    ///
    /// ```
    /// # mod fiber {
    /// #     pub(crate) use fiber_chan as chan;
    /// #     pub use fiber_core::yield_now;
    /// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
    /// #     pub use fiber_sched::sleep;
    /// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    /// #         fiber_sched::Runtime::new().unwrap().block_on(f)
    /// #     }
    /// # }
    /// fiber::run(|| {
    ///     let job = fiber::Job::new(None);
    ///     let (tx, rx) = fiber::chan::unbounded();
    ///     let handles: Vec<_> = (0..3u32)
    ///         .map(|i| {
    ///             let tx = tx.clone();
    ///             job.spawn(move || tx.send(i * 10).unwrap())
    ///         })
    ///         .collect();
    ///     assert!(job.is_active());
    ///     assert!(job.complete()); // no more work of its own
    ///     assert_eq!(job.join(), Ok(fiber::JobState::Completed));
    ///     drop(tx);
    ///     let mut got: Vec<u32> = rx.iter().collect();
    ///     got.sort();
    ///     assert_eq!(got, [0, 10, 20]);
    ///     for h in handles {
    ///         h.join().unwrap();
    ///     }
    /// });
    /// ```
    pub fn new(parent: Option<&Job>) -> Job {
        Job {
            core: JobCore::standalone(parent.map(|p| p.core.clone()), false),
        }
    }

    /// [`Job::new`] for a supervisor: Kotlin's `SupervisorJob()`. A
    /// child's failure stays with that child (its handle's `join`
    /// reports it); the job and its other children go on.
    pub fn new_supervisor(parent: Option<&Job>) -> Job {
        Job {
            core: JobCore::standalone(parent.map(|p| p.core.clone()), true),
        }
    }

    /// Kotlin's `CompletableJob.complete()` for a job made by
    /// [`Job::new`] / [`Job::new_supervisor`]: it has no more work of its
    /// own, so it ends as soon as its children have (COMPLETED unless one
    /// failed or it was cancelled meanwhile). Children spawned after this,
    /// while others still run, are waited for too; once it has ended, a
    /// spawned child starts cancelled. Returns `true` if this call
    /// completed it, `false` if it was completed before or is cancelling
    /// or has ended.
    ///
    /// # Panics
    ///
    /// If the job is not one made by `Job::new` / `Job::new_supervisor`:
    /// a scope's, a fiber's or a `with_timeout` job ends when its body
    /// returns.
    #[track_caller]
    pub fn complete(&self) -> bool {
        if !self.core.is_standalone() {
            panic!(
                "fiber::Job::complete called on a job that runs a body of its own (a scope's, a fiber's or a \
                 with_timeout job), which ends when that body returns; only a job made by Job::new or \
                 Job::new_supervisor is completed by hand"
            );
        }
        self.core.complete()
    }

    /// Start `f` as a fiber in a new child job of this one (Kotlin's
    /// `CoroutineScope(job).launch { }`), on the runtime of the calling
    /// fiber. The handle joins it as a scope's does: the value, or a
    /// `JoinError` saying it panicked or was cancelled; its
    /// [`job`](ScopedJoinHandle::job) is the child's job. A panic in `f`
    /// fails the child and, unless this job is a supervisor, cancels this
    /// job and its other children; nothing re-raises it (the handle's
    /// `join` reports it). A child spawned into a job that is cancelling or
    /// has ended starts cancelled: `f` is dropped unrun.
    ///
    /// # Panics
    ///
    /// If called outside a fiber (there is no runtime to run the child);
    /// if the job is not one made by `Job::new` / `Job::new_supervisor`
    /// (spawn into a scope with `Scope::spawn`); or if the fiber cannot
    /// be spawned (its stack refused, or the runtime is shutting down),
    /// as `fiber::spawn` does.
    #[track_caller]
    pub fn spawn<F, T>(&self, f: F) -> ScopedJoinHandle<'static, T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if !self.core.is_standalone() {
            panic!(
                "fiber::Job::spawn called on a job that runs a body of its own (a scope's, a fiber's or a \
                 with_timeout job): spawn its children with Scope::spawn; Job::spawn starts fibers in a job \
                 made by Job::new or Job::new_supervisor"
            );
        }
        let Some(sched) = fiber_core::current_scheduler() else {
            panic!(
                "fiber::Job::spawn called outside a fiber: there is no runtime to run the child on; call it \
                 from a fiber (fiber::run, Runtime::block_on, or a fiber spawned with Handle::spawn)"
            );
        };
        // SAFETY: `f`, `T` and `()` are 'static: the child borrows nothing.
        match unsafe {
            spawn_child_of(
                &self.core,
                &sched,
                move || Ok::<T, ()>(f()),
                None,
                SpawnOptions::default(),
            )
        } {
            Ok(handle) => handle,
            Err(e) => panic!("fiber::Job::spawn: could not spawn the child fiber: {e}"),
        }
    }

    /// The job this one is attached to: the enclosing job of a scope or
    /// `with_timeout` body, the scope's job of a scoped child. `None` for a
    /// root job (a fiber from [`fiber::spawn`](fiber_core::spawn), a
    /// runtime's root fiber) and for a scope opened directly inside
    /// [`non_cancellable`](fiber_core::non_cancellable), which is detached
    /// from the job it was opened in. Kotlin's `Job.parent`.
    ///
    /// ```
    /// # mod fiber {
    /// #     pub(crate) use fiber_chan as chan;
    /// #     pub use fiber_core::yield_now;
    /// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
    /// #     pub use fiber_sched::sleep;
    /// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    /// #         fiber_sched::Runtime::new().unwrap().block_on(f)
    /// #     }
    /// # }
    /// fiber::run(|| {
    ///     let outer = fiber::Job::current();
    ///     fiber::scope(|s| {
    ///         assert_eq!(s.job().parent(), Some(outer.clone()));
    ///         let child = s.spawn(|| fiber::Job::current().parent());
    ///         assert_eq!(child.join().unwrap(), Some(s.job()));
    ///     });
    ///     assert_eq!(outer.parent(), None);
    /// });
    /// ```
    pub fn parent(&self) -> Option<Job> {
        self.core.parent.clone().map(|core| Job { core })
    }

    /// The children of this job that have not ended, as a snapshot (a
    /// child attached or ended after the call is not reflected), in no
    /// particular order. A job's children are the jobs of the scopes and
    /// `with_timeout` bodies opened directly in it, the jobs of the fibers
    /// spawned in it if it is a scope's job (or a job from [`Job::new`]),
    /// and the jobs made with it as their parent; the fibers spawned in a
    /// fiber's scopes are children of the scopes' jobs, not of the fiber's.
    /// Kotlin's `Job.children`, which likewise lists only children that
    /// have not completed.
    ///
    /// ```
    /// # mod fiber {
    /// #     pub(crate) use fiber_chan as chan;
    /// #     pub use fiber_core::yield_now;
    /// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
    /// #     pub use fiber_sched::sleep;
    /// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    /// #         fiber_sched::Runtime::new().unwrap().block_on(f)
    /// #     }
    /// # }
    /// fiber::run(|| {
    ///     fiber::scope(|s| {
    ///         let (tx, rx) = fiber::chan::bounded::<()>(0);
    ///         let waiting = s.spawn(move || rx.recv().is_err());
    ///         let done = s.spawn(|| ());
    ///         done.join().unwrap();
    ///         assert_eq!(s.job().children(), vec![waiting.job()]);
    ///         drop(tx);
    ///         assert!(waiting.join().unwrap());
    ///         assert!(s.job().children().is_empty());
    ///     });
    /// });
    /// ```
    pub fn children(&self) -> Vec<Job> {
        self.core.live_children().into_iter().map(|core| Job { core }).collect()
    }

    /// Run `handler` once, with the job's final state (`Completed`,
    /// `Cancelled` or `Failed`), when the job ends: Kotlin's
    /// `invokeOnCompletion`. If the job has already ended, `handler` runs
    /// now, on the caller. Otherwise it runs on the thread (or in the
    /// fiber) that ends the job, after the final state is set and before
    /// the job's parked joiners are woken and its parent hears of the end:
    /// when a scope returns, the handlers of all its children have run.
    /// Handlers added before the job ended run in the order they were
    /// added; one added once it has ended runs at once on the caller, which
    /// may be while the earlier ones still run on the thread that ended it
    /// (as in Kotlin).
    ///
    /// A handler never runs inside the job that ended: where the fiber
    /// running it is in an ended job (the fiber that ended it), the handler
    /// runs in that job's parent instead (the scope's job for a scoped
    /// child: `Job::current()` there is the parent, and its cancellation is
    /// what `fiber::is_cancelled()` reports), or in no job if it has no
    /// parent (a fiber's root job: `Job::try_current()` is `None`).
    /// Anywhere else it runs in the job of the thread or fiber that runs
    /// it. As in Kotlin, a handler should be quick and should not
    /// wait: it holds up the job's joiners and parent while it runs. A
    /// handler that
    /// panics is reported by the panic hook and goes no further: the other
    /// handlers still run and the job still ends as it did. A job that
    /// never ends (a fiber that never returns, a standalone job never
    /// completed nor cancelled) never runs its handlers; they are dropped
    /// with the job. A handler is kept inside its job until it runs, so a
    /// handler that holds a clone of its own `Job` keeps that job alive: if
    /// the job never ends, neither is ever freed (a reference cycle, as
    /// with an `Arc` stored in itself). Capture what the handler needs
    /// (`job.id()`, a channel) rather than the job.
    ///
    /// ```
    /// # mod fiber {
    /// #     pub(crate) use fiber_chan as chan;
    /// #     pub use fiber_core::yield_now;
    /// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
    /// #     pub use fiber_sched::sleep;
    /// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    /// #         fiber_sched::Runtime::new().unwrap().block_on(f)
    /// #     }
    /// # }
    /// use std::sync::{Arc, Mutex};
    ///
    /// fiber::run(|| {
    ///     let log = Arc::new(Mutex::new(Vec::new()));
    ///     fiber::scope(|s| {
    ///         let (_hold, rx) = fiber::chan::bounded::<()>(0);
    ///         let ok = s.spawn(|| 1);
    ///         let stopped = s.spawn(move || rx.recv().is_ok());
    ///         for (name, job) in [("ok", ok.job()), ("stopped", stopped.job())] {
    ///             let log = log.clone();
    ///             job.invoke_on_completion(move |state| log.lock().unwrap().push((name, state)));
    ///         }
    ///         stopped.cancel();
    ///     });
    ///     // The scope returned: every child's handler has run.
    ///     let mut log = log.lock().unwrap().clone();
    ///     log.sort_by_key(|(name, _)| *name);
    ///     assert_eq!(log, [("ok", fiber::JobState::Completed), ("stopped", fiber::JobState::Cancelled)]);
    /// });
    /// ```
    pub fn invoke_on_completion<F>(&self, handler: F)
    where
        F: FnOnce(JobState) + Send + 'static,
    {
        self.core.invoke_on_completion(Box::new(handler));
    }

    /// Cancel every child of this job that has not ended (and their
    /// subtrees), but not the job itself: it stays active, and children
    /// attached later start uncancelled. Kotlin's `Job.cancelChildren()`.
    /// When the call returns, each of those children is cancelling (or has
    /// ended) and every fiber parked in them has been woken, as with
    /// [`cancel`](Self::cancel).
    ///
    /// ```
    /// # mod fiber {
    /// #     pub(crate) use fiber_chan as chan;
    /// #     pub use fiber_core::yield_now;
    /// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
    /// #     pub use fiber_sched::sleep;
    /// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    /// #         fiber_sched::Runtime::new().unwrap().block_on(f)
    /// #     }
    /// # }
    /// fiber::run(|| {
    ///     fiber::scope(|s| {
    ///         let (_tx, rx) = fiber::chan::bounded::<()>(0);
    ///         let a = s.spawn(move || rx.recv().is_err());
    ///         fiber::yield_now().unwrap();
    ///         s.job().cancel_children();
    ///         assert!(a.join().unwrap_err().is_cancelled());
    ///         assert!(s.job().is_active());
    ///         assert_eq!(s.spawn(|| 7).join().unwrap(), 7);
    ///     });
    /// });
    /// ```
    pub fn cancel_children(&self) {
        for child in self.core.live_children() {
            child.cancel(CancelReason::Cancelled);
        }
    }
}

/// Two `Job`s are equal when they are handles to the same job (Kotlin's
/// identity comparison of `Job` objects).
impl PartialEq for Job {
    fn eq(&self, other: &Job) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }
}

impl Eq for Job {}

/// Hashes the job's identity, consistent with `PartialEq`.
impl std::hash::Hash for Job {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.core), state);
    }
}

/// Where the running fiber stands to `job` (see [`inside`]).
enum Inside {
    /// Not inside it (or it has ended): a join can wait.
    No,
    /// Inside it, and no job from the caller's up to `job` is cancelled:
    /// a join would wait for the caller itself.
    Yes,
    /// Inside it, and a job on the way up to `job` (or `job` itself) is
    /// cancelled while the caller does not hold cancellation off: that
    /// cancellation reaches the caller (a canceller still part way down
    /// the subtree has had its walk finished by [`inside`]), which is
    /// cancelled.
    Cancelled,
}

/// Does the running fiber run inside the unfinished `job` (its job is
/// `job` or one of `job`'s descendants, or a job made inside
/// `fiber::non_cancellable` there), and is it being cancelled? On a plain
/// thread running a `fiber::blocking` call, the fiber waiting for that
/// call counts. Makes no root job.
fn inside(job: &Arc<JobCore>) -> Inside {
    if job.state().is_terminal() {
        return Inside::No;
    }
    // On a blocking-pool thread: the job of the fiber waiting for the call.
    let Some(scope) = fiber_core::current_cancel_scope().or_else(fiber_core::behalf_cancel_scope) else {
        return Inside::No;
    };
    let scope: Arc<dyn std::any::Any + Send + Sync> = scope;
    let mut at = scope.downcast::<JobCore>().ok();
    let mut found = false;
    // A cancellation reaches the caller down the parent links from its own
    // job; not through a job made inside `non_cancellable` (reached by its
    // `enclosing` link, which the cancellation held off there does not
    // cross), and not at all directly inside such a section.
    let mut reaches = !fiber_core::cancellation_held_off();
    let mut cancelled = false;
    // The highest job on the way up that is CANCELLING (not only past a
    // deadline, which every job below it inherits and reads at once).
    let mut cancelling = None;
    // The whole chain: a cancel of a job above `job` reaches the caller as
    // well.
    while let Some(current) = at {
        if reaches {
            cancelled |= current.observed_state() != JobState::Active;
            if current.state() == JobState::Cancelling {
                cancelling = Some(current.clone());
            }
        }
        found |= Arc::ptr_eq(&current, job);
        at = match &current.parent {
            Some(parent) => Some(parent.clone()),
            None => {
                reaches = false;
                current.enclosing.clone()
            }
        };
    }
    if !found {
        return Inside::No;
    }
    if !cancelled {
        return Inside::Yes;
    }
    // The cancel that turned that job CANCELLING may still be on its way
    // down: finish its walk here (it changes no reason), so the caller,
    // told it is cancelled, also reads `is_cancelled()` as true from now
    // on.
    if let Some(top) = cancelling {
        top.cancel_contained(CancelReason::Cancelled);
    }
    Inside::Cancelled
}

/// A new job for a scope (`supervisor` for a supervisor scope) or a
/// `with_timeout` (with its `deadline`) opened here: a child of the
/// current job, except directly inside `fiber::non_cancellable`, where the
/// job starts with no parent (the cancellation held off there must not
/// reach it, as the children of Kotlin's `NonCancellable` are not
/// cancelled with the outer job; the scope still returns its failure to
/// its caller) and only remembers the job it was made in (`enclosing`).
fn new_job(supervisor: bool, deadline: Option<Instant>) -> Arc<JobCore> {
    if fiber_core::cancellation_held_off() {
        JobCore::held_off(existing_job(), supervisor, deadline)
    } else {
        JobCore::with_deadline(current_job(), supervisor, false, deadline)
    }
}

/// The running fiber's job if it has one (none is made here).
fn existing_job() -> Option<Arc<JobCore>> {
    let scope: Arc<dyn std::any::Any + Send + Sync> = fiber_core::current_cancel_scope()?;
    scope.downcast::<JobCore>().ok()
}

/// The running fiber's job: the one it runs in, or (for a fiber outside
/// any job) a root job made now and installed as the fiber's root scope.
fn current_job() -> Option<Arc<JobCore>> {
    match fiber_core::current_cancel_scope() {
        Some(scope) => {
            let scope: Arc<dyn std::any::Any + Send + Sync> = scope;
            // A checked downcast: a scope of any other type is not a job.
            scope.downcast::<JobCore>().ok()
        }
        None if fiber_core::accepts_root_scope() => {
            // Counted and traced only once installed: a `tracing` layer
            // that asks for the current job from that event then finds
            // this one, instead of making another (and so on, until the
            // stack overflowed).
            let root = JobCore::new_root_uncounted();
            match fiber_core::install_root_scope(root.clone()) {
                Ok(already_cancelled) => {
                    root.count_root_created();
                    if let Some(me) = fiber_core::current_fiber() {
                        root.add_fiber(me);
                    }
                    if already_cancelled {
                        root.cancel_contained(CancelReason::Cancelled);
                    }
                    Some(root)
                }
                Err(_) => None,
            }
        }
        None => None,
    }
}

pub use fiber_core::Cancelled;

/// `with_timeout`'s deadline passed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimedOut;

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the operation timed out")
    }
}

impl std::error::Error for TimedOut {}

/// A timeout as an `io::Error` of kind `TimedOut` whose inner error is
/// `TimedOut`, so that `fiber::with_timeout(d, f)?` works in a function
/// returning `io::Result`.
///
/// ```
/// # mod fiber {
/// #     pub(crate) use fiber_chan as chan;
/// #     pub use fiber_core::yield_now;
/// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
/// #     pub use fiber_sched::sleep;
/// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
/// #         fiber_sched::Runtime::new().unwrap().block_on(f)
/// #     }
/// # }
/// use std::time::Duration;
///
/// fn slow() -> std::io::Result<u32> {
///     let value = fiber::with_timeout(Duration::from_millis(1), || {
///         let _ = fiber::sleep(Duration::from_secs(60));
///         1
///     })?;
///     Ok(value)
/// }
///
/// let err = fiber::run(slow).unwrap_err();
/// assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
/// ```
impl From<TimedOut> for io::Error {
    fn from(timed_out: TimedOut) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, timed_out)
    }
}

/// Has the running fiber been cancelled: its job (or an ancestor's), its
/// `JoinHandle::cancel`, or its runtime's shutdown? `false` on a plain
/// thread. This is how a caller tells an operation that failed because the
/// fiber was cancelled (a channel operation, a join) from one that failed
/// on its own (a disconnected channel).
pub fn is_cancelled() -> bool {
    fiber_core::is_cancel_requested()
}

/// `Err(Cancelled)` if the running fiber's job was cancelled: a cheap
/// cooperative check for loops with no other cancellable point.
pub fn check_cancelled() -> Result<(), Cancelled> {
    if is_cancelled() {
        Err(Cancelled)
    } else {
        Ok(())
    }
}

/// Run `f` on the running fiber as the body of `job`: the fiber's waits see
/// the job's cancellation, and the job can interrupt them.
fn run_in_job<R>(job: &Arc<JobCore>, f: impl FnOnce() -> R) -> std::thread::Result<R> {
    let me = fiber_core::current_fiber();
    let id = me.as_ref().map(|me| me.id());
    if let Some(me) = me {
        job.add_fiber(me);
    }
    let previous = fiber_core::swap_cancel_scope(Some(job.clone() as Arc<dyn CancelScope>));
    let outcome = catch_unwind(AssertUnwindSafe(f));
    fiber_core::swap_cancel_scope(previous);
    if let Some(id) = id {
        job.remove_fiber(id);
    }
    outcome
}

#[track_caller]
fn require_fiber(what: &str) {
    if !fiber_core::in_fiber() {
        #[cfg(not(loom))]
        if fiber_core::behalf_fiber_id().is_some() {
            panic!(
                "fiber::{what} called inside a fiber::blocking call: the call runs on a plain thread of \
                 the blocking pool, not in a fiber; open the scope (or the timeout) in the fiber around \
                 the call"
            );
        }
        panic!(
            "fiber::{what} called outside a fiber: it runs its work as a job of the calling fiber; start a \
             runtime with fiber::run(|| ...) and call fiber::{what} from inside it"
        );
    }
}

/// How a scope treats a child's failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// First failure fails the scope and cancels the siblings.
    Regular,
    /// Failures stay with the child.
    Supervisor,
}

/// The result a child leaves for its handle.
enum Outcome<T> {
    Value(T),
    Panicked(SharedPayload),
    Failed,
    Cancelled,
}

/// A scoped child's body and its obligations: whatever happens to it (run,
/// dropped unrun because the runtime shut down or the spawn failed), it
/// drops everything it owns and only then tells the scope it is done, so
/// the scope cannot return while the child still holds a borrow.
struct ChildBody<F, T, E> {
    f: Option<F>,
    job: Arc<JobCore>,
    /// The outcome type, which travels through the job (`JobCore`'s
    /// outcome slot) to the handle.
    _outcome: PhantomData<fn() -> T>,
    /// `try_scope`'s first error (`None` for plain scopes, whose children
    /// cannot fail with an error).
    error: Option<Arc<Mutex<Option<E>>>>,
    done: bool,
    /// The fiber that ran the body, still registered with the job (to
    /// interrupt on cancel) until `finish` leaves the outcome.
    registered: Option<FiberId>,
}

impl<F, T, E> ChildBody<F, T, E>
where
    F: FnOnce() -> Result<T, E>,
{
    fn run(mut self) {
        let f = self.f.take().expect("a child body runs once");
        // The child's job is the fiber's scope from here until the child
        // has dropped everything it owns (`finish`): user destructors of
        // its closure or its value see the job they belong to.
        let previous = fiber_core::swap_cancel_scope(Some(self.job.clone() as Arc<dyn CancelScope>));
        let outcome = if self.job.is_cancelled() {
            // Cancelled before it started: its closure is dropped unrun.
            match catch_unwind(AssertUnwindSafe(move || drop(f))) {
                Ok(()) => Outcome::Cancelled,
                Err(payload) => self.panicked(payload),
            }
        } else {
            let me = fiber_core::current_fiber();
            self.registered = me.as_ref().map(|me| me.id());
            if let Some(me) = me {
                self.job.add_fiber(me);
            }
            let outcome = catch_unwind(AssertUnwindSafe(f));
            if fiber_core::is_shutting_down() {
                // The runtime's shutdown cancelled this child (as it does
                // the fiber's root job): its job ends CANCELLED, not
                // COMPLETED, and a value it returned is dropped.
                self.job.cancel_contained(CancelReason::Cancelled);
            }
            match outcome {
                Ok(Ok(value)) => Outcome::Value(value),
                // A child cancelled on its own (its handle's `cancel`, the
                // scope still active) that returns `Err` passed that
                // cancellation on (`fiber::sleep(d)?`): it ends CANCELLED
                // and its error is dropped, so the siblings and the scope
                // go on, as Kotlin's parent ignores a child's
                // `CancellationException`. When the scope itself is
                // cancelling, the error is recorded as below.
                Ok(Err(e)) if self.job.cancelled_alone() => match catch_unwind(AssertUnwindSafe(move || drop(e))) {
                    Ok(()) => Outcome::Cancelled,
                    Err(payload) => self.panicked(payload),
                },
                Ok(Err(e)) => {
                    // The first error is the scope's; a later one is
                    // dropped here, outside the slot's lock, and a panic of
                    // its `Drop` makes this child a panicked one (its
                    // locals and its end still follow, below).
                    let unwanted = match &self.error {
                        Some(error) => {
                            let mut slot = lock(error);
                            if slot.is_none() {
                                *slot = Some(e);
                                None
                            } else {
                                Some(e)
                            }
                        }
                        None => Some(e),
                    };
                    match catch_unwind(AssertUnwindSafe(move || drop(unwanted))) {
                        Ok(()) => {
                            self.job.fail_contained(Failure::Error, CancelReason::ChildFailed);
                            Outcome::Failed
                        }
                        Err(payload) => self.panicked(payload),
                    }
                }
                Err(payload) if fiber_core::is_shutdown_unwind(&*payload) => Outcome::Cancelled,
                Err(payload) => self.panicked(payload),
            }
        };
        // The child's fiber-locals go before its outcome is published, so
        // its handle's join returns after their destructors ran (std's
        // scoped join waits for thread-local destructors); they run inside
        // the child's job. A panicking one is swallowed (the others are
        // still dropped), as for a spawned fiber.
        // SAFETY: this is the fiber's body, its top frame, and the child's
        // closure has returned: no `with_fiber_local` reference of this
        // fiber is alive.
        if let Err(payload) = catch_unwind(|| unsafe { fiber_core::drop_fiber_locals() }) {
            // The payload's own `Drop` may panic: leaked then, never raised.
            if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                std::mem::forget(again);
            }
        }
        self.finish(outcome);
        drop(fiber_core::swap_cancel_scope(previous));
    }
}

impl<F, T, E> ChildBody<F, T, E> {
    fn panicked(&self, payload: Box<dyn Any + Send>) -> Outcome<T> {
        let shared: SharedPayload = Arc::new(Mutex::new(Some(payload)));
        self.job
            .fail_contained(Failure::Panic(shared.clone()), CancelReason::ChildFailed);
        Outcome::Panicked(shared)
    }

    fn finish(&mut self, outcome: Outcome<T>) {
        self.done = true;
        // SAFETY: this child's job carries `Outcome<T>` only (its handle
        // names the same `T`: both are made by `spawn_child`, which requires
        // `T: Send`).
        if let Some(unjoined) = unsafe { self.job.finish_with_outcome(outcome, self.registered.take()) } {
            // Nobody will join: drop the value here, before `body_done`.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(move || drop(unjoined))) {
                let shared: SharedPayload = Arc::new(Mutex::new(Some(payload)));
                self.job
                    .fail_contained(Failure::Panic(shared), CancelReason::ChildFailed);
            }
            self.job.body_done();
        }
    }
}

impl<F, T, E> Drop for ChildBody<F, T, E> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Dropped unrun: drop the closure first, then report; on the
        // child's fiber (at shutdown) inside its job, as in `run`.
        let previous = fiber_core::swap_cancel_scope(Some(self.job.clone() as Arc<dyn CancelScope>));
        let f = self.f.take();
        // Why the child never ran, if its first run found no stack: it
        // fails (as a panic with that message), so that its scope does not
        // return as if its work were done, as `std::thread::Scope::spawn`
        // panics when it cannot create a thread.
        let start_failure = fiber_core::start_failure();
        let outcome = match catch_unwind(AssertUnwindSafe(move || drop(f))) {
            Ok(()) => match start_failure {
                Some(why) => self.panicked(Box::new(why)),
                None => Outcome::Cancelled,
            },
            Err(payload) => self.panicked(payload),
        };
        if matches!(outcome, Outcome::Cancelled) {
            // It never ran because its runtime shut down: its job ends
            // CANCELLED, as the job of a child the shutdown cancelled
            // while it ran (`run`). Reported as cancelled but not
            // cancelled, the job ended COMPLETED, and its handle and its
            // job disagreed (`reviews/review71.rs`).
            self.job.cancel_contained(CancelReason::Cancelled);
        }
        self.finish(outcome);
        drop(fiber_core::swap_cancel_scope(previous));
    }
}

/// A scope: spawn children that may borrow from outside it; the scope
/// returns only when all of them have ended.
pub struct Scope<'scope, 'env: 'scope> {
    job: Arc<JobCore>,
    /// The runtime the scope's children run on (its owner's), so that a
    /// plain thread borrowing the scope can spawn into it too.
    sched: Arc<dyn fiber_core::Schedule>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

// As std's `thread::Scope` (`&Scope` is `UnwindSafe`, so a closure that
// spawns from a borrowed scope passes `catch_unwind`): the job and runtime
// behind it are changed only under their own locks, never left half-done
// by an unwind.
impl std::panic::RefUnwindSafe for Scope<'_, '_> {}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope").field("job", &self.job).finish()
    }
}

/// A handle to join a child of a scope.
pub struct ScopedJoinHandle<'scope, T> {
    job: Arc<JobCore>,
    id: FiberId,
    name: Option<Arc<str>>,
    _scope: PhantomData<&'scope ()>,
    _outcome: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for ScopedJoinHandle<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedJoinHandle")
            .field("fiber", &self.id)
            .finish_non_exhaustive()
    }
}

impl<T> Drop for ScopedJoinHandle<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the job carries `Outcome<T>`, `T: Send` (see
        // `spawn_child`).
        let unjoined = unsafe { self.job.take_outcome::<Outcome<T>>() };
        // An outcome the child already left is dropped by the handle's
        // owner, inside the scope.
        drop(unjoined);
    }
}

impl<T> ScopedJoinHandle<'_, T> {
    /// Wait for the child and take its value. `JoinError` says whether it
    /// panicked (with the payload, unless the scope already re-raised it),
    /// was cancelled before it produced a value, or returned an error that
    /// its `try_scope` took. The wait is a cancellable point: if the joining
    /// fiber's job is cancelled first, it returns `Cancelled` (and the
    /// child's value is dropped).
    ///
    /// # Panics
    ///
    /// Panics if called by the child this handle joins (it would wait for
    /// itself forever), as `std::thread::JoinHandle::join` does, or by a
    /// fiber running inside that child's job (a fiber of a scope the child
    /// opened, which the child waits for), as [`Job::join`] does.
    #[track_caller]
    pub fn join(self) -> Result<T, JoinError> {
        if fiber_core::current_id() == Some(self.id) && !self.is_finished() {
            panic!(
                "ScopedJoinHandle::join called by the child it joins ({}): a fiber cannot wait for its own end",
                self.id
            );
        }
        // The usual joiner is the scope's body, whose job is the child's
        // parent: known without a walk.
        let by_parent = self
            .job
            .parent
            .as_ref()
            .is_some_and(|p| fiber_core::current_cancel_scope_is(Arc::as_ptr(p) as *const ()));
        // A fiber inside the child's job (a grandchild, in a scope the
        // child waits on) would wait for itself: refused as `Job::join`
        // refuses it.
        // Such a fiber that is being cancelled from the child's job (a
        // canceller part way down the subtree) is a cancelled joiner.
        let cancelled = match if by_parent { Inside::No } else { inside(&self.job) } {
            Inside::No => false,
            Inside::Cancelled => true,
            Inside::Yes => panic!(
                "ScopedJoinHandle::join called from inside the child it joins ({}), by a fiber of a scope \
                 that child opened: the child ends only after this fiber does; the join would wait for itself",
                self.id
            ),
        };
        // The body's join of its own child is not ended by cancellation
        // (std waits for the thread): whatever cancels the body cancels
        // the child too, so it ends soon, and a failed sibling cancels the
        // body with the scope: a join that then returned `Cancelled` lost
        // the child's value, or left its panic unjoined (re-raised by the
        // scope). Any other joiner (a sibling the handle was sent to) is
        // cancelled on its own, and its join is a cancellation point.
        let state = if cancelled {
            None
        } else if by_parent {
            self.job.join_child()
        } else {
            self.job.join()
        };
        // Take the outcome and retire the handle under one lock (what
        // `Drop` would do again otherwise).
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped after these reads: each
        // field is moved out exactly once, and `ManuallyDrop` keeps the
        // handle's `Drop` from running on the moved-from fields.
        let (job, name) = unsafe { (std::ptr::read(&this.job), std::ptr::read(&this.name)) };
        let id = this.id;
        // SAFETY: the job carries `Outcome<T>`, `T: Send` (see
        // `spawn_child`).
        let (outcome, reason) = unsafe { job.take_outcome_and_reason::<Outcome<T>>() };
        drop(job);
        let Some(state) = state else {
            // The joining fiber was cancelled while it waited; the child's
            // value (if it has one by now) is dropped here.
            drop(outcome);
            return Err(JoinError::join_cancelled(id).with_name(name));
        };
        Self::outcome_to_result(id, state, reason, outcome).map_err(|e| e.with_name(name))
    }

    fn outcome_to_result(
        id: FiberId,
        state: JobState,
        reason: Option<CancelReason>,
        outcome: Option<Outcome<T>>,
    ) -> Result<T, JoinError> {
        // A child cancelled by a `with_timeout` deadline (its own job's
        // reason: the deadline's job or an ancestor's) reports it.
        let cancelled = || match reason {
            Some(CancelReason::TimedOut) => JoinError::timed_out(id),
            _ => JoinError::cancelled(id),
        };
        match outcome {
            // A job cancelled before its body ended ends CANCELLED even if
            // its closure returned a value (decided once, under the job's
            // lock); the value is dropped here, once.
            Some(Outcome::Value(_)) if state == JobState::Cancelled => Err(cancelled()),
            Some(Outcome::Value(v)) => Ok(v),
            Some(Outcome::Panicked(payload)) => {
                let payload = lock(&payload)
                    .take()
                    .unwrap_or_else(|| Box::new("the panic payload was already taken by the scope"));
                Err(JoinError::panicked(id, payload))
            }
            Some(Outcome::Failed) => Err(JoinError::failed(id)),
            Some(Outcome::Cancelled) | None => Err(cancelled()),
        }
    }

    /// Has the child ended?
    pub fn is_finished(&self) -> bool {
        self.job.state().is_terminal()
    }

    /// Cancel this child (and its subtree).
    pub fn cancel(&self) {
        self.job.cancel(CancelReason::Cancelled);
    }

    /// The child's fiber id.
    pub fn id(&self) -> FiberId {
        self.id
    }

    /// A handle to the child fiber (its id, name, and `unpark`), like
    /// `std::thread::ScopedJoinHandle::thread`.
    pub fn fiber(&self) -> fiber_core::FiberHandle {
        fiber_core::FiberHandle::of_unjoined(self.id, self.job.clone(), self.name.clone())
    }

    /// The same as [`fiber`](Self::fiber), under std's name
    /// (`std::thread::ScopedJoinHandle::thread`), so that
    /// `handle.thread().id()` and `handle.thread().unpark()` port
    /// unchanged. It returns the handle by value, where std lends one.
    pub fn thread(&self) -> fiber_core::FiberHandle {
        self.fiber()
    }

    /// The child's job (what [`Job::current`] returns inside the child):
    /// its state, its children, waiting for it without taking its value.
    /// The handle of Kotlin's `launch` is such a job, so
    /// `job.isActive` / `isCancelled` / `isCompleted` port as
    /// `handle.job().is_active()` and so on.
    ///
    /// ```
    /// # mod fiber {
    /// #     pub(crate) use fiber_chan as chan;
    /// #     pub use fiber_core::yield_now;
    /// #     pub use fiber_jobs::{scope, with_timeout, Job, JobState};
    /// #     pub use fiber_sched::sleep;
    /// #     pub fn run<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    /// #         fiber_sched::Runtime::new().unwrap().block_on(f)
    /// #     }
    /// # }
    /// fiber::run(|| {
    ///     fiber::scope(|s| {
    ///         let (_tx, rx) = fiber::chan::bounded::<()>(0);
    ///         let child = s.spawn(move || rx.recv().is_err());
    ///         let job = child.job();
    ///         assert!(job.is_active());
    ///         child.cancel();
    ///         assert!(job.is_cancelled());
    ///         job.join().unwrap();
    ///         assert!(job.is_completed());
    ///         assert!(child.join().unwrap_err().is_cancelled());
    ///     });
    /// });
    /// ```
    pub fn job(&self) -> Job {
        Job { core: self.job.clone() }
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Spawn a child fiber in this scope; it may borrow anything that
    /// outlives the scope.
    ///
    /// # Panics
    ///
    /// If the child cannot be spawned, as `std::thread::Scope::spawn`
    /// panics when it cannot create a thread: its stack was refused, or
    /// the call comes from outside the runtime's fibers (a plain thread
    /// that borrowed the scope) once the runtime is shutting down. Use
    /// [`try_spawn_with`](Self::try_spawn_with) to get the error instead.
    #[track_caller]
    pub fn spawn<F, T>(&'scope self, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        match self.spawn_child(move || Ok::<T, ()>(f()), None, SpawnOptions::default()) {
            Ok(handle) => handle,
            // The body was dropped unrun, so the child is already done.
            Err(e) => panic!("fiber::Scope::spawn: could not spawn the child fiber: {e}"),
        }
    }

    /// Spawn a child with per-fiber options (a name, pinning), returning
    /// an error instead of panicking if it cannot be spawned. This is what
    /// `fiber::Builder::spawn_scoped` calls.
    #[track_caller]
    pub fn try_spawn_with<F, T>(&'scope self, options: SpawnOptions, f: F) -> io::Result<ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> T + Send + 'scope,
        T: Send + 'scope,
    {
        self.spawn_child(move || Ok::<T, ()>(f()), None, options)
    }

    #[track_caller]
    fn spawn_child<F, T, E>(
        &'scope self,
        f: F,
        error: Option<Arc<Mutex<Option<E>>>>,
        options: SpawnOptions,
    ) -> io::Result<ScopedJoinHandle<'scope, T>>
    where
        F: FnOnce() -> Result<T, E> + Send + 'scope,
        T: Send + 'scope,
        E: Send + 'scope,
    {
        // SAFETY: the scope joins every child (`join_children`, also when its
        // body panics) before it returns, and a child drops everything it
        // owns (closure, value, locals) before `body_done` releases that
        // join, whether it ran or was dropped unrun (`ChildBody`); so nothing
        // the closure borrows for 'scope is used after the scope ends. This
        // is std::thread::scope's argument.
        unsafe { spawn_child_of(&self.job, &self.sched, f, error, options) }
    }

    /// The scope's job.
    pub fn job(&self) -> Job {
        Job { core: self.job.clone() }
    }

    /// Cancel the scope's job (the same as `s.job().cancel()`; Kotlin's
    /// `CoroutineScope.cancel`): every child, and the scope's body itself,
    /// see it at their next cancellation point. The scope still returns
    /// only once every child has ended.
    ///
    /// ```
    /// # mod fiber { pub(crate) use fiber_chan as chan; pub use fiber_jobs::scope; pub use fiber_sched::Runtime; }
    /// # let rt = fiber::Runtime::new().unwrap();
    /// # rt.block_on(|| {
    /// let first_even = fiber::scope(|s| {
    ///     let (tx, rx) = fiber::chan::bounded(0);
    ///     for i in [3, 5, 8, 9] {
    ///         let tx = tx.clone();
    ///         // Those still sending when the scope is cancelled stop there.
    ///         s.spawn(move || tx.send(i));
    ///     }
    ///     let found = rx.iter().find(|i| i % 2 == 0);
    ///     s.cancel();
    ///     found
    /// });
    /// assert_eq!(first_even, Some(8));
    /// # });
    /// ```
    pub fn cancel(&self) {
        self.job().cancel();
    }
}

/// Spawn `f` as a child of `parent` (a new child job, the fiber's
/// per-fiber block, which carries its outcome), on `sched`.
///
/// # Safety
///
/// Whatever `f`, `T` and `E` borrow stays valid until the child has
/// dropped everything it owns (its `body_done`), as
/// [`fiber_core::try_spawn_unjoined`] requires.
#[track_caller]
unsafe fn spawn_child_of<'a, F, T, E>(
    parent: &Arc<JobCore>,
    sched: &Arc<dyn fiber_core::Schedule>,
    f: F,
    error: Option<Arc<Mutex<Option<E>>>>,
    options: SpawnOptions,
) -> io::Result<ScopedJoinHandle<'a, T>>
where
    F: FnOnce() -> Result<T, E> + Send + 'a,
    T: Send + 'a,
    E: Send + 'a,
{
    let child = JobCore::new(Some(parent.clone()), false, true);
    let body = ChildBody {
        f: Some(f),
        job: child.clone(),
        _outcome: PhantomData,
        error,
        done: false,
        registered: None,
    };
    let name = options.name.clone();
    // SAFETY: the caller's contract covers the borrows. The child's job is
    // its per-fiber block (its park token) and carries its outcome. On an
    // error the body was dropped unrun, so the child is done.
    let spawned = unsafe { fiber_core::try_spawn_unjoined(sched, options, child.clone(), move || body.run()) };
    let id = match spawned {
        Ok(id) => id,
        Err(e) => {
            // The body was dropped unrun and left `Cancelled` for a
            // handle that will never exist: take it back (a boxed
            // outcome would leak otherwise).
            // SAFETY: the job carries `Outcome<T>`, `T: Send`.
            drop(unsafe { child.take_outcome::<Outcome<T>>() });
            return Err(e);
        }
    };
    Ok(ScopedJoinHandle {
        job: child,
        id,
        name,
        _scope: PhantomData,
        _outcome: PhantomData,
    })
}

/// A `try_scope`: children return `Result<_, E>`.
///
/// Unlike [`Scope`], the body receives this handle by value (it is `Copy`),
/// so an error type that names `'static` (`Result<_, &'static str>`) and
/// children that borrow the caller's stack compile together; a reference
/// to it would tie the error type's lifetimes to the scope's, which the
/// borrow checker resolves to `'static` for every borrow.
pub struct TryScope<'scope, 'env: 'scope, E> {
    inner: &'scope Scope<'scope, 'env>,
    /// The first error (a child's, or the body's own): points into the
    /// `Arc` that `try_scope` holds until every child has ended.
    error: NonNull<Mutex<Option<E>>>,
    _error: PhantomData<fn(E) -> E>,
}

impl<E> Clone for TryScope<'_, '_, E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for TryScope<'_, '_, E> {}

// SAFETY: a `TryScope` is a shared reference to the scope plus a shared
// reference to a `Mutex<Option<E>>` (which is `Send + Sync` when `E: Send`);
// both are valid for 'scope. Sharing or sending it is sharing those.
unsafe impl<E: Send> Send for TryScope<'_, '_, E> {}
// SAFETY: as for `Send`: every access goes through the mutex.
unsafe impl<E: Send> Sync for TryScope<'_, '_, E> {}

impl<E> fmt::Debug for TryScope<'_, '_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl<'scope, 'env, E: Send> TryScope<'scope, 'env, E> {
    /// Spawn a fallible child: its first `Err` fails the scope, cancels the
    /// siblings and is what `try_scope` returns.
    ///
    /// # Panics
    ///
    /// If the child cannot be spawned, as [`Scope::spawn`].
    #[track_caller]
    pub fn spawn<F, T>(self, f: F) -> ScopedJoinHandle<'scope, T>
    where
        F: FnOnce() -> Result<T, E> + Send + 'scope,
        T: Send + 'scope,
        E: 'scope,
    {
        let ptr = self.error.as_ptr().cast_const();
        // SAFETY: `ptr` came from `Arc::as_ptr` on the `Arc` that
        // `try_scope` keeps alive until after every child has ended and the
        // body has returned, which is past 'scope, the lifetime of `self`;
        // so the count is positive here and the new `Arc` owns one of it.
        let error = unsafe {
            Arc::increment_strong_count(ptr);
            Arc::from_raw(ptr)
        };
        match self.inner.spawn_child(f, Some(error), SpawnOptions::default()) {
            Ok(handle) => handle,
            Err(e) => panic!("fiber::TryScope::spawn: could not spawn the child fiber: {e}"),
        }
    }

    /// The scope's job.
    pub fn job(&self) -> Job {
        self.inner.job()
    }

    /// Cancel the scope's job, as [`Scope::cancel`].
    pub fn cancel(&self) {
        self.inner.cancel();
    }
}

fn open_scope(kind: Kind) -> Arc<JobCore> {
    // The fiber's operation budget: a loop of short scopes lets the
    // fibers beside it run.
    fiber_core::coop_point();
    new_job(kind == Kind::Supervisor, None)
}

/// Finish a scope after its body: wait for the children, finalize, then
/// re-raise a panic (the body's, or a child's) or report an error.
#[track_caller]
fn close_scope<T>(job: &Arc<JobCore>, body: std::thread::Result<T>) -> Result<T, Option<Box<dyn Any + Send>>> {
    let mut teardown = None;
    // The body's own panic: re-raised if the recorded failure's payload
    // was taken by a join (the body typically re-raised it, or panicked
    // on the join's error, as with `std::thread::scope`).
    let mut body_panic: Option<SharedPayload> = None;
    let body = match body {
        Ok(v) => Some(v),
        Err(payload) if fiber_core::is_shutdown_unwind(&*payload) => {
            // The runtime is tearing this fiber down: the scope is
            // cancelled (shutdown is a cancellation, not a failure), and
            // the unwind goes on once the children have ended.
            job.cancel_contained(CancelReason::Cancelled);
            teardown = Some(payload);
            None
        }
        Err(payload) => {
            let shared: SharedPayload = Arc::new(Mutex::new(Some(payload)));
            body_panic = Some(shared.clone());
            job.fail_contained(Failure::Panic(shared), CancelReason::ChildFailed);
            None
        }
    };
    job.join_children();
    if fiber_core::is_shutting_down() {
        // Shutdown cancelled the fiber running this scope while the scope
        // was open (its body, or its wait for the children): the scope's
        // job ends CANCELLED, as its children's and the fiber's root job do.
        job.cancel_contained(CancelReason::Cancelled);
    }
    job.body_done();
    if let Some(payload) = teardown {
        // A child's failure, if any, is dropped with the job.
        drop(job.take_failure());
        resume_unwind(payload);
    }
    let failure = job.take_failure();
    // Payloads of children that failed after the first: the scope raises
    // at most one panic, and what it does not raise is dropped below,
    // before it returns, as `std::thread::scope` leaves no result of its
    // threads behind (they stayed in the job, which the parent's list
    // keeps until a sweep, and were dropped at some later point).
    let later = job.take_later_panics();
    let closing = match failure {
        Some(Failure::Panic(shared)) => {
            let payload = lock(&shared)
                .take()
                .or_else(|| body_panic.as_ref().and_then(|own| lock(own).take()))
                .or_else(|| later.iter().find_map(|p| lock(p).take()));
            match (payload, body) {
                (Some(p), _) => Closing::Raise(p),
                // Every failed child was joined by the body, which took its
                // panic and returned: handled (std: "if you want to handle
                // panics from spawned threads, join them before the end of
                // the scope").
                (None, Some(v)) => Closing::Return(Ok(v)),
                (None, None) => Closing::Taken,
            }
        }
        Some(Failure::Error) => Closing::Return(Err(None)),
        None => Closing::Return(Ok(body.expect("a scope body that did not panic returned a value"))),
    };
    for shared in later.iter().chain(body_panic.as_ref()) {
        let unraised = lock(shared).take();
        // A payload's own `Drop` may panic: leaked then, never raised
        // over the scope's outcome.
        if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(unraised))) {
            std::mem::forget(again);
        }
    }
    match closing {
        Closing::Raise(payload) => resume_unwind(payload),
        Closing::Return(result) => result,
        Closing::Taken => panic!("a fiber of this scope panicked (its payload was taken by a join)"),
    }
}

/// How a closing scope ends (`close_scope`), decided before it drops the
/// payloads it does not raise.
enum Closing<T> {
    /// Re-raise this panic.
    Raise(Box<dyn Any + Send>),
    /// Return this.
    Return(Result<T, Option<Box<dyn Any + Send>>>),
    /// A failure whose payload a join took, with no value to return.
    Taken,
}

/// Run `f` with a scope whose children may borrow from the caller, like
/// `std::thread::scope`: the scope returns when every child has ended. A
/// child's panic fails the scope, cancels the siblings, and is re-raised
/// here once all children are done, unless a `join` of that child took it
/// (then the siblings are still cancelled, but the scope returns normally,
/// as `std::thread::scope` re-raises only panics no join took).
///
/// # Panics
///
/// Panics outside a fiber (the children are fibers), and re-raises panics
/// as above.
#[track_caller]
pub fn scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    require_fiber("scope");
    run_scope(Kind::Regular, f)
}

/// Open a scope of `kind`, run the body in it, wait for the children.
#[track_caller]
fn run_scope<'env, F, T>(kind: Kind, f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    let job = open_scope(kind);
    let scope = Scope {
        job: job.clone(),
        sched: fiber_core::current_scheduler().expect("a scope is opened in a fiber"),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let body = run_in_job(&job, || f(&scope));
    match close_scope(&job, body) {
        Ok(v) => v,
        Err(_) => unreachable!("only try_scope children return errors"),
    }
}

/// Like [`scope`], but a child's failure neither fails the scope nor cancels
/// its siblings; it stays with the child for whoever joins it.
#[track_caller]
pub fn supervisor_scope<'env, F, T>(f: F) -> T
where
    F: for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
{
    require_fiber("supervisor_scope");
    run_scope(Kind::Supervisor, f)
}

/// The fallible scope: children return `Result<_, E>`; the first `Err`
/// fails the scope, cancels the siblings and is what `try_scope` returns
/// (after every child has ended). The body may return its own `Err` too.
///
/// A child cancelled on its own (through its handle's `cancel`, while the
/// scope is not cancelling) that returns `Err` is taken to pass that
/// cancellation on (`fiber::sleep(d)?`): it ends cancelled, its error is
/// dropped, and the scope and the siblings go on, as a Kotlin parent
/// ignores a child's `CancellationException`.
#[track_caller]
pub fn try_scope<'env, F, T, E>(f: F) -> Result<T, E>
where
    F: for<'scope> FnOnce(TryScope<'scope, 'env, E>) -> Result<T, E>,
    E: Send,
{
    require_fiber("try_scope");
    let job = open_scope(Kind::Regular);
    let error: Arc<Mutex<Option<E>>> = Arc::new(Mutex::new(None));
    let inner = Scope {
        job: job.clone(),
        sched: fiber_core::current_scheduler().expect("a scope is opened in a fiber"),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let scope = TryScope {
        inner: &inner,
        // `error` outlives the scope: it is dropped at the end of this
        // function, after `close_scope` has waited for every child.
        error: NonNull::from(&*error),
        _error: PhantomData,
    };
    let body = run_in_job(&job, || f(scope));
    // The body's own error when a child's came first: kept until every
    // child has ended (its `Drop` may panic, and a panic out of here
    // before `close_scope` would leave children running on the caller's
    // borrows).
    let mut later_error = None;
    let body = match body {
        Ok(Err(e)) => {
            // The body's own error: record it, then fail the scope (which
            // cancels the children). Recorded as the scope's failure, so
            // a child that fails later (a panic on being cancelled) does
            // not replace it: the first failure wins, as for children.
            let mut slot = lock(&error);
            let first = slot.is_none();
            if first {
                *slot = Some(e);
            } else {
                later_error = Some(e);
            }
            drop(slot);
            if first {
                job.fail_contained(Failure::Error, CancelReason::ChildFailed);
            } else {
                job.cancel_contained(CancelReason::Cancelled);
            }
            Ok(None)
        }
        Ok(Ok(v)) => Ok(Some(v)),
        Err(p) => Err(p),
    };
    let result = close_scope(&job, body);
    // Every child has ended: a panic of this drop leaves nothing running.
    drop(later_error);
    let first_error = lock(&error).take();
    match (result, first_error) {
        (_, Some(e)) => Err(e),
        (Ok(Some(v)), None) => Ok(v),
        (Ok(None), None) | (Err(_), None) => unreachable!("a failed try_scope recorded its error"),
    }
}

/// A wait that only ends when `with_timeout`'s body signals it.
struct Done(Mutex<(bool, Option<fiber_core::Waiter>)>);

/// Tells a `with_timeout` watchdog that the job is closed (its wait ends
/// and it exits without cancelling), when dropped.
struct ReleaseWatchdog(Arc<Done>);

impl Drop for ReleaseWatchdog {
    fn drop(&mut self) {
        let waiter = {
            let mut d = lock(&self.0 .0);
            d.0 = true;
            d.1.take()
        };
        if let Some(w) = waiter {
            w.wake();
        }
    }
}

impl fiber_core::Waitable for Done {
    type Io = ();
    fn try_complete(&self, _: &mut ()) -> Option<fiber_core::WaitResult> {
        lock(&self.0).0.then_some(fiber_core::WaitResult::Ok)
    }
    fn publish(&self, waiter: &fiber_core::Waiter, _: &mut ()) -> fiber_core::Publish {
        let mut done = lock(&self.0);
        if done.0 {
            return fiber_core::Publish::Ready(fiber_core::WaitResult::Ok);
        }
        done.1 = Some(waiter.clone());
        fiber_core::Publish::Published
    }
    fn unpublish(&self, _: &fiber_core::Waiter, _: &mut ()) -> Option<fiber_core::WaitResult> {
        let mut done = lock(&self.0);
        done.1 = None;
        done.0.then_some(fiber_core::WaitResult::Ok)
    }
}

/// Run `f` on the running fiber in a new job that is cancelled when
/// `timeout` passes. Returns `Err(TimedOut)` if the deadline came first
/// (whatever `f` returned is dropped); `f` sees the cancellation at its
/// cancellable points. A timeout is its own error, never a plain
/// cancellation; an explicit cancel of the enclosing job wins over it.
/// A zero timeout returns `Err(TimedOut)` at once without running `f`
/// (Kotlin's `withTimeout` with a non-positive time).
///
/// The outcome is decided when `f` returns, so an operation that completed
/// inside `f` just as the deadline passed is lost with `f`'s value: a
/// wrapped `rx.recv()` or `stream.read(&mut buf)` can take a message or
/// bytes and still return `Err(TimedOut)`, as with Kotlin's `withTimeout`.
/// To wait for data with a time limit, use the operation's own timed form
/// (`Receiver::recv_timeout`, `select!` with an `after` arm,
/// `TcpStream::set_read_timeout`): it either takes the data or times out,
/// never both. The same holds for `TcpListener::accept`: a connection
/// accepted as the deadline passes is dropped with `f`'s value (its client
/// sees a reset). For a timed accept, give the listener a receive timeout
/// (`SO_RCVTIMEO`, e.g. set through `socket2` on a std listener passed to
/// `TcpListener::from_std`), which `accept` honours with `WouldBlock`.
///
/// Inside `f`, a wait the deadline interrupts returns `Err(Cancelled)`
/// (`fiber::sleep`, `yield_now`, [`check_cancelled`]): pass it on with `?`
/// (let `f` return a `Result`) rather than `unwrap()` it, which turns the
/// timeout into a panic. The timeout is still the outcome.
///
/// ```
/// # mod fiber { pub use fiber_core::yield_now; pub use fiber_jobs::{with_timeout, Cancelled}; pub use fiber_sched::Runtime; }
/// use std::time::Duration;
///
/// let rt = fiber::Runtime::new().unwrap();
/// let outcome = rt.block_on(|| {
///     fiber::with_timeout(Duration::from_millis(20), || -> Result<(), fiber::Cancelled> {
///         loop {
///             // Work, then a cancellation point: `?` ends the loop at the
///             // deadline.
///             fiber::yield_now()?;
///         }
///     })
/// });
/// assert!(outcome.is_err()); // Err(TimedOut): the value (if any) is dropped
/// ```
///
/// # Panics
///
/// Panics outside a fiber, and if the fiber that enforces the deadline
/// cannot be given a stack (the kernel refuses to map one; as
/// `std::thread::spawn` panics when it cannot create a thread), before
/// `f` runs.
#[track_caller]
pub fn with_timeout<T>(timeout: Duration, f: impl FnOnce() -> T) -> Result<T, TimedOut> {
    require_fiber("with_timeout");
    if timeout.is_zero() {
        return Err(TimedOut);
    }
    let deadline = Instant::now().checked_add(timeout);
    let job = new_job(false, deadline);
    let done = Arc::new(Done(Mutex::new((false, None))));
    // The dump shows the watchdog parked at the user's `with_timeout` call.
    let site = std::panic::Location::caller();
    // The watchdog takes its stack at the spawn: one that could not start
    // later would leave the deadline unenforced, and a body parked past
    // it would wait for ever.
    let spawned = {
        let (job, done) = (job.clone(), done.clone());
        let sched = fiber_core::current_scheduler().expect("with_timeout runs in a fiber (checked above)");
        let options = fiber_core::SpawnOptions {
            stack_now: true,
            // Clean-up code of a runtime shutting down may open a
            // `with_timeout` in `non_cancellable`: its deadline must
            // still fire in the grace time (the body ends it otherwise).
            starts_in_shutdown: true,
            ..Default::default()
        };
        fiber_core::try_spawn_with(&sched, options, move || {
            let options = fiber_core::WaitOptions::new()
                .deadline(deadline)
                .interrupt(fiber_core::Interrupt::NotCancellable);
            if fiber_core::fiber_wait_at(&*done, &mut (), options, site) == fiber_core::WaitResult::TimedOut {
                // A `tracing` layer panicking as it logs the cancellation:
                // the walk has still been done (the deadline holds); the
                // panic is said on stderr, as one on a runtime thread.
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job.cancel(CancelReason::TimedOut))) {
                    fiber_core::layer_panicked("cancelling a with_timeout job at its deadline", payload);
                }
            }
        })
    };
    let watchdog = match spawned {
        Ok(watchdog) => watchdog,
        Err(e) => {
            // The job ends at once (it has no child and no body ran), so
            // that its parent does not wait for it, and the call fails
            // loudly, as `std::thread::spawn` does without a thread.
            let _ = close_scope(&job, Ok(()));
            panic!("fiber::with_timeout: cannot start the fiber that enforces the deadline: {e}");
        }
    };
    let body = run_in_job(&job, f);
    // Did the deadline pass before `f` returned? Decided here, not by the
    // watchdog fiber, which may not have run yet (a busy worker). The job's
    // deadline: its own or an enclosing `with_timeout`'s, whichever is
    // earlier (the outer one's watchdog may not have run either).
    let late = job.deadline_passed();
    if late {
        job.cancel_contained(CancelReason::TimedOut);
    }
    // The job ends before this fiber parks for the watchdog: a deadline
    // passing while it waits there (a busy worker) must not turn a body
    // that returned in time into a timed-out job (`finalize` ends a job
    // found past its deadline CANCELLED). With no child left (the body's
    // scopes closed inside it), closing does not park. A child that
    // outlives the body (a standalone job made under this one with
    // `Job::new`) is waited for here, with the watchdog still armed: at
    // the deadline it cancels the job and that child with it, as Kotlin's
    // `withTimeout` times out while it waits for its children (it used to
    // be released before, and the wait lasted for ever:
    // `reviews/review66.rs`). The watchdog's cancel of an ended job
    // changes nothing.
    // Released on every path, also when the close re-raises the body's
    // panic (the watchdog would otherwise stay parked until the deadline).
    let release = ReleaseWatchdog(done);
    let closed = close_scope(&job, body);
    drop(release);
    let timed_out = job.reason() == Some(CancelReason::TimedOut);
    let _ = watchdog.join();
    match closed {
        Ok(_) if timed_out => Err(TimedOut),
        Ok(v) => Ok(v),
        Err(_) => unreachable!("with_timeout has no fallible children"),
    }
}
