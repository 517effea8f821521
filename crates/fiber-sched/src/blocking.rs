//! The blocking pool: [`crate::blocking`] runs its closure on threads that
//! are not workers (tokio's `spawn_blocking`, Go's threads for blocking
//! system calls), while the calling fiber parks. A worker is never held by
//! a blocking call, so other fibers keep their cores and timers stay on
//! time however many blocking calls are in flight.
//!
//! One pool per runtime, created on first use and found through a
//! process-wide table keyed by the runtime's id (it holds the pools weakly:
//! a pool whose threads all retired is freed and made again on the next
//! call). At most `Config::max_blocking_threads` threads; a call that finds
//! none idle and the cap reached queues, and the next thread to finish
//! takes it. A thread idle for `Config::thread_keep_alive` (10 s unless
//! set) retires.
//!
//! # Borrowing
//!
//! The closure may borrow from the calling fiber's stack (as in
//! `std::thread::scope`): the caller does not return, and is not unwound
//! past the call, before the closure has run and been dropped. The normal
//! path parks until the pool thread signals completion (after the closure
//! and everything it owned were dropped); a forced unwind of the parked
//! fiber (runtime shutdown) blocks in the guard's `Drop` until then.
//! Cancellation cannot abandon a running closure, so the wait is not
//! cancellable.

use crate::sync::{lock, Mutex};
use crate::worker::Shared;
use fiber_core::{fiber_wait, fiber_wake, Interrupt, Publish, WaitOptions, WaitResult, Waitable, Waiter};
use std::collections::VecDeque;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Weak};
use std::time::{Duration, Instant};

/// A queued call: `job(true)` runs it; `job(false)` hands its closure
/// back to its caller unrun (the runtime shut down before a thread took
/// it).
type Job = Box<dyn FnOnce(bool) + Send + 'static>;

#[derive(Default)]
struct PoolState {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
    /// The runtime has shut down: a thread exits as soon as the queue is
    /// empty instead of waiting out its keep-alive.
    closed: bool,
}

struct Pool {
    /// The runtime whose calls this pool runs.
    runtime_id: usize,
    /// Calls submitted and not yet completed. The deadlock check reads it
    /// as a hint; a shut-down runtime's reaper reads a 0 as "every caller
    /// is woken" (Release decrement after the wake, Acquire read).
    in_flight: std::sync::atomic::AtomicUsize,
    state: Mutex<PoolState>,
    work: Condvar,
    cap: usize,
    /// How long an idle thread waits for a call before it retires.
    keep_alive: Duration,
    name: String,
}

std::thread_local! {
    /// On a blocking-pool thread: the id of the runtime it serves (0 on
    /// any other thread; runtime ids start at 1).
    static POOL_THREAD_OF: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// On a blocking-pool thread: is it running a call now (false between
    /// calls and in its thread-local destructors as it retires)?
    static IN_CALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Is this thread one of runtime `runtime_id`'s blocking-pool threads? A
/// fiber of that runtime may be parked waiting for the call it runs.
pub(crate) fn on_pool_thread_of(runtime_id: usize) -> bool {
    POOL_THREAD_OF.try_with(|id| id.get() == runtime_id).unwrap_or(false)
}

/// Is this thread one of runtime `runtime_id`'s blocking-pool threads, in
/// the middle of a call (a fiber of that runtime waits for it)? Between
/// calls, or in a thread-local destructor as the thread retires, no fiber
/// waits on it.
pub(crate) fn in_call_of(runtime_id: usize) -> bool {
    on_pool_thread_of(runtime_id) && IN_CALL.try_with(|c| c.get()).unwrap_or(false)
}

/// Run one queued call, marked as in a call for [`in_call_of`].
fn run_marked(job: Job) {
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            let _ = IN_CALL.try_with(|c| c.set(false));
        }
    }
    let _ = IN_CALL.try_with(|c| c.set(true));
    let _unmark = Unmark;
    job(true);
}

/// On a blocking-pool thread, the id of the runtime it serves
/// (`Handle::current` there names that runtime, as tokio's does inside
/// `spawn_blocking`).
pub(crate) fn pool_runtime() -> Option<usize> {
    POOL_THREAD_OF.try_with(|id| id.get()).ok().filter(|&id| id != 0)
}

/// Is this thread a blocking-pool thread of any runtime (running, or
/// waiting to run, a `fiber::blocking` call)? For misuse messages.
pub fn on_blocking_thread() -> bool {
    POOL_THREAD_OF.try_with(|id| id.get() != 0).unwrap_or(false)
}

/// Pools by runtime id, held weakly.
static POOLS: std::sync::Mutex<Vec<(usize, Weak<Pool>)>> = std::sync::Mutex::new(Vec::new());

fn pool_for(shared: &Shared) -> Arc<Pool> {
    let mut pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    pools.retain(|(_, pool)| pool.strong_count() > 0);
    if let Some(pool) = pools
        .iter()
        .find(|(id, _)| *id == shared.id)
        .and_then(|(_, p)| p.upgrade())
    {
        return pool;
    }
    let pool = Arc::new(Pool {
        runtime_id: shared.id,
        in_flight: std::sync::atomic::AtomicUsize::new(0),
        state: Mutex::new(PoolState::default()),
        work: Condvar::new(),
        cap: shared.config.max_blocking_threads,
        keep_alive: shared.config.thread_keep_alive,
        name: format!("{}-blocking", shared.config.thread_name),
    });
    pools.push((shared.id, Arc::downgrade(&pool)));
    pool
}

/// Runtime `runtime_id` has shut down: its idle pool threads exit now, and
/// busy ones once the queue is empty (a dropped runtime leaves no thread
/// waiting out the keep-alive). Calls still queued (every thread was busy)
/// never start on the pool: each closure goes back to its caller, unrun,
/// and the caller (once teardown takes it back) drops it as it unwinds, as
/// tokio's pool drops a `spawn_blocking` task that has not started; a
/// caller that cannot unwind there (a destructor running after its fiber's
/// body) runs it itself. Run after the runtime's teardown, so those callers
/// cannot be running user code meanwhile.
pub(crate) fn close(runtime_id: usize) {
    let pools: Vec<Arc<Pool>> = {
        let pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .iter()
            .filter(|(id, _)| *id == runtime_id)
            .filter_map(|(_, pool)| pool.upgrade())
            .collect()
    };
    for pool in pools {
        let unstarted = {
            let mut state = lock(&pool.state);
            state.closed = true;
            std::mem::take(&mut state.queue)
        };
        pool.work.notify_all();
        // Outside every lock: a completion wakes the caller.
        for job in unstarted {
            job(false);
        }
    }
}

/// Blocking calls of runtime `runtime_id` submitted and not yet completed.
/// A fiber parked in such a call is waiting for a thread, not deadlocked:
/// the deadlock check should treat a non-zero count like a pending timer.
pub(crate) fn in_flight(runtime_id: usize) -> usize {
    let pools = POOLS.lock().unwrap_or_else(|p| p.into_inner());
    pools
        .iter()
        .filter(|(id, _)| *id == runtime_id)
        .filter_map(|(_, pool)| pool.upgrade())
        // Acquire: pairs with the Release decrement after each call's
        // wake, so a 0 read orders every caller's wake (its state change
        // and queue push) before what the reader does next.
        .map(|pool| pool.in_flight.load(std::sync::atomic::Ordering::Acquire))
        .sum()
}

impl Pool {
    /// Queue `job`; start a thread if none is idle and the cap allows.
    /// Returns the job back if no thread runs or can run it.
    fn submit(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        let mut state = lock(&self.state);
        // An idle thread counts only if no queued job already claims it
        // (`idle` drops when the woken thread takes the lock, not at the
        // notify).
        if state.idle > state.queue.len() {
            state.queue.push_back(job);
            drop(state);
            self.work.notify_one();
            return Ok(());
        }
        if state.threads >= self.cap {
            // Every thread is busy: the first to finish takes it.
            state.queue.push_back(job);
            return Ok(());
        }
        state.threads += 1;
        drop(state);
        let pool = self.clone();
        let (first, back) = {
            // The new thread starts with this job; if it cannot be started
            // the job comes back through the channel-free slot below.
            let slot = Arc::new(std::sync::Mutex::new(Some(job)));
            (slot.clone(), slot)
        };
        let spawned = std::thread::Builder::new()
            .name(self.name.clone())
            .spawn(move || pool.run(first));
        match spawned {
            Ok(_) => Ok(()),
            Err(_) => {
                lock(&self.state).threads -= 1;
                let job = back.lock().unwrap_or_else(|p| p.into_inner()).take();
                match job {
                    Some(job) => Err(job),
                    None => Ok(()),
                }
            }
        }
    }

    fn run(self: Arc<Self>, first: Arc<std::sync::Mutex<Option<Job>>>) {
        POOL_THREAD_OF.with(|id| id.set(self.runtime_id));
        let first = first.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(job) = first {
            run_marked(job);
        }
        let mut state = lock(&self.state);
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                run_marked(job);
                state = lock(&self.state);
                continue;
            }
            state.idle += 1;
            // `None`: no deadline (`Duration::MAX`).
            let deadline = Instant::now().checked_add(self.keep_alive);
            let mut timed_out = false;
            while state.queue.is_empty() {
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) || state.closed {
                    timed_out = true;
                    break;
                }
                state = match deadline {
                    Some(d) => match self.work.wait_timeout(state, d - now) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    },
                    None => self.work.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner()),
                };
            }
            state.idle -= 1;
            if timed_out {
                // Under the lock: a submitter that saw this thread idle
                // queued before we looked, so the queue was checked last.
                state.threads -= 1;
                return;
            }
        }
    }
}

/// Completion of one call: the result slot the pool thread fills.
struct Done<R> {
    state: std::sync::Mutex<DoneState<R>>,
    finished: Condvar,
}

struct DoneState<R> {
    result: Option<std::thread::Result<R>>,
    finished: bool,
    /// The call, handed back unrun: the runtime shut down while it was
    /// queued. It may borrow the caller's frame (see `run`).
    unrun: Option<Unrun<R>>,
    waiter: Option<Waiter>,
}

/// A call handed back to its caller unrun.
type Unrun<R> = Box<dyn FnOnce() -> std::thread::Result<R> + Send + 'static>;

impl<R> Done<R> {
    fn lock(&self) -> std::sync::MutexGuard<'_, DoneState<R>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The call ended: with the closure's result, or handed back unrun.
    fn complete(&self, result: Result<std::thread::Result<R>, Unrun<R>>) {
        let waiter = {
            let mut state = self.lock();
            match result {
                Ok(result) => state.result = Some(result),
                Err(unrun) => state.unrun = Some(unrun),
            }
            state.finished = true;
            state.waiter.take()
        };
        self.finished.notify_all();
        if let Some(waiter) = waiter {
            fiber_wake(&waiter);
        }
    }

    /// Block the thread (not the fiber) until the job finished, then take
    /// the result, or the call handed back unrun (`None` once taken).
    fn wait_blocking(&self) -> Option<Result<std::thread::Result<R>, Unrun<R>>> {
        let mut state = self.lock();
        while !state.finished {
            state = self.finished.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        match state.result.take() {
            Some(result) => Some(Ok(result)),
            None => state.unrun.take().map(Err),
        }
    }
}

impl<R> Waitable for Done<R> {
    type Io = ();

    fn kind(&self) -> fiber_core::WaitKind {
        fiber_core::WaitKind::Blocking
    }

    fn try_complete(&self, _: &mut ()) -> Option<WaitResult> {
        self.lock().finished.then_some(WaitResult::Ok)
    }

    fn publish(&self, waiter: &Waiter, _: &mut ()) -> Publish {
        let mut state = self.lock();
        if state.finished {
            return Publish::Ready(WaitResult::Ok);
        }
        state.waiter = Some(waiter.clone());
        Publish::Published
    }

    fn unpublish(&self, waiter: &Waiter, _: &mut ()) -> Option<WaitResult> {
        let mut state = self.lock();
        if state.waiter.as_ref().is_some_and(|w| w.same_wait(waiter)) {
            state.waiter = None;
        }
        state.finished.then_some(WaitResult::Ok)
    }
}

/// Waits for the job (blocking the thread) if the caller leaves early
/// (a forced unwind), and drops the result on the caller's side in every
/// case, so nothing that borrows the caller's stack outlives it.
struct Guard<'a, R>(&'a Done<R>);

impl<R> Drop for Guard<'_, R> {
    fn drop(&mut self) {
        drop(self.0.wait_blocking());
    }
}

/// Run `f` on `shared`'s blocking pool, parking the calling fiber.
#[track_caller]
pub(crate) fn run<F, R>(shared: &Shared, f: F) -> R
where
    F: FnOnce() -> R + Send,
    R: Send,
{
    let pool = pool_for(shared);
    let done = Arc::new(Done {
        state: std::sync::Mutex::new(DoneState {
            result: None,
            finished: false,
            unrun: None,
            waiter: None,
        }),
        finished: Condvar::new(),
    });
    let guard = Guard(&done);
    let signal = done.clone();
    let counted = pool.clone();
    counted.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The caller travels with the call (misuse checks only: a join there of
    // the caller, or of a job it runs in, would wait for itself).
    let origin = fiber_core::OnBehalf::of_current();
    let job: Box<dyn FnOnce(bool) + Send + '_> = Box::new(move |run: bool| {
        // `f` (and everything it captured) is consumed and dropped inside
        // `catch_unwind`, before completion is signalled; or, at shutdown,
        // handed back to the caller unrun.
        let result = if run {
            Ok(fiber_core::run_on_behalf_of(origin, || {
                catch_unwind(AssertUnwindSafe(f))
            }))
        } else {
            let unrun: Box<dyn FnOnce() -> std::thread::Result<R> + Send + '_> =
                Box::new(move || catch_unwind(AssertUnwindSafe(f)));
            // SAFETY: as for the job below: the caller's frame, which `f`
            // may borrow, outlives it (the caller takes it back and runs or
            // drops it before it returns or unwinds past this call).
            Err(unsafe {
                std::mem::transmute::<Box<dyn FnOnce() -> std::thread::Result<R> + Send + '_>, Unrun<R>>(unrun)
            })
        };
        signal.complete(result);
        // After the wake: once a shut-down runtime's reaper sees no call in
        // flight, every caller it gave up on is back in a run queue
        // (`Runtime::shutdown`).
        // Release: pairs with the Acquire read in `in_flight`.
        counted.in_flight.fetch_sub(1, std::sync::atomic::Ordering::Release);
    });
    // SAFETY: the job may borrow from this frame. It is always called (the
    // pool never drops a queued job: it runs it, or at shutdown hands the
    // closure back into `done`; a job that cannot get a thread comes back
    // and runs here), and this frame is not left before the job signalled
    // completion: the park below ends only when `finished` is set, and
    // `guard` blocks any unwind until then. A closure handed back is taken
    // out of `done` on this side (below, or by the guard) and run or
    // dropped here. The only things the job touches after signalling are
    // its `Arc<Done>`, which owns its memory, and its `Arc<Pool>` (the
    // in-flight count).
    let job: Job = unsafe { std::mem::transmute::<Box<dyn FnOnce(bool) + Send + '_>, Job>(job) };
    if let Err(job) = pool.submit(job) {
        job(true);
    }
    // The job borrows this frame: not even teardown may unwind out of here.
    let options = WaitOptions::new().interrupt(Interrupt::Never);
    while fiber_wait(&*done, &mut (), options) != WaitResult::Ok {}
    let result = done.wait_blocking();
    drop(guard);
    match result {
        Some(Ok(Ok(value))) => value,
        Some(Ok(Err(payload))) => resume_unwind(payload),
        Some(Err(unrun)) => {
            // The runtime shut down while the call was queued: it comes
            // back unrun, and this fiber is being torn down. A cancellable
            // wait unwinds it (the shutdown unwind), dropping the closure
            // here, on its own stack. A fiber that cannot unwind here (a
            // destructor running after its body, which teardown lets run
            // to its end) runs the call itself instead.
            let _ = fiber_core::wait_until(Some(Instant::now()), Interrupt::Cancellable);
            match unrun() {
                Ok(value) => value,
                Err(payload) => resume_unwind(payload),
            }
        }
        None => unreachable!("blocking: the result was taken twice"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Two jobs submitted back to back while one thread is idle: the second
    /// must not count on the idle thread the first one already claimed
    /// (both wait for each other, so queueing them behind one thread
    /// would leave each waiting out its timeout).
    #[test]
    fn an_idle_thread_serves_one_queued_job() {
        let pool = Arc::new(Pool {
            runtime_id: usize::MAX,
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            state: Mutex::new(PoolState::default()),
            work: Condvar::new(),
            cap: 8,
            keep_alive: crate::config::DEFAULT_THREAD_KEEP_ALIVE,
            name: "test-blocking".to_string(),
        });
        assert!(pool.submit(Box::new(|_| ())).is_ok());
        while lock(&pool.state).idle == 0 {
            std::thread::yield_now();
        }
        let (a_tx, a_rx) = mpsc::channel::<()>();
        let (b_tx, b_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel::<bool>();
        let wait = Duration::from_secs(10);
        let done_a = done_tx.clone();
        assert!(pool
            .submit(Box::new(move |_| {
                a_tx.send(()).unwrap();
                done_a.send(b_rx.recv_timeout(wait).is_ok()).unwrap();
            }))
            .is_ok());
        assert!(pool
            .submit(Box::new(move |_| {
                b_tx.send(()).unwrap();
                done_tx.send(a_rx.recv_timeout(wait).is_ok()).unwrap();
            }))
            .is_ok());
        assert!(
            done_rx.recv().unwrap() && done_rx.recv().unwrap(),
            "the two jobs did not overlap"
        );
    }
}
