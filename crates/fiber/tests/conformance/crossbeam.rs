//! crossbeam-channel's own test suite (crossbeam-rs/crossbeam,
//! `crossbeam-channel/tests/`: zero, array, list, select, select_macro,
//! ready, iter, after, tick, never, same_channel, thread_locals)
//! ported onto `fiber::chan`.
//!
//! Every test body runs three ways, each its own `#[test]`: on plain OS
//! threads (peers are `std::thread`s), in fibers of a 1-worker runtime and
//! in fibers of a 2-worker runtime (peers are fibers). Each run has a hang
//! guard. Iteration counts are cut down from upstream's, and sleeps
//! shortened where the assertion does not depend on their length.
//!
//! Adaptations for cooperative scheduling: a loop that only polls
//! (`try_recv`, `try_select`, `try_iter`) calls `relax()` (a yield) so a
//! single worker can run the peer it polls for; sleeps are `fiber::sleep`
//! in a fiber.
//!
//! `golang.rs` is not ported here: `conformance/go_chan.rs` ports the same
//! Go sources.

#![allow(
    clippy::never_loop,
    clippy::redundant_clone,
    clippy::unnecessary_literal_unwrap,
    clippy::diverging_sub_expression,
    clippy::redundant_closure_call,
    clippy::or_fun_call,
    unreachable_code,
    clippy::type_complexity
)]

use fiber::chan::{
    after, bounded, never, select, select_biased, tick, unbounded, Receiver, RecvError, RecvTimeoutError, Select,
    SendError, SendTimeoutError, Sender, TryRecvError, TrySendError,
};
use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Harness.

use crate::three_ways::*;

/// crossbeam_utils' scope: fibers of a `fiber::scope`, or scoped threads.
#[derive(Clone, Copy)]
enum Sc<'scope, 'env: 'scope> {
    F(&'scope fiber::Scope<'scope, 'env>),
    T(&'scope std::thread::Scope<'scope, 'env>),
}

#[allow(dead_code)] // `join` is there for bodies that need a peer's value
enum ScH<'scope, T> {
    F(fiber::ScopedJoinHandle<'scope, T>),
    T(std::thread::ScopedJoinHandle<'scope, T>),
}

#[allow(dead_code)]
impl<T: Send> ScH<'_, T> {
    fn join(self) -> T {
        match self {
            ScH::F(h) => h.join().unwrap_or_else(|e| {
                if e.is_panic() {
                    resume_unwind(e.into_panic())
                } else {
                    panic!("scoped fiber failed: {e}")
                }
            }),
            ScH::T(h) => h.join().unwrap_or_else(|p| resume_unwind(p)),
        }
    }
}

impl<'scope, 'env> Sc<'scope, 'env> {
    fn spawn<R: Send + 'scope>(self, f: impl FnOnce() -> R + Send + 'scope) -> ScH<'scope, R> {
        match self {
            Sc::F(s) => ScH::F(s.spawn(f)),
            Sc::T(s) => ScH::T(s.spawn(f)),
        }
    }
}

fn scope<'env, R>(f: impl for<'scope> FnOnce(Sc<'scope, 'env>) -> R) -> R {
    if in_fiber() {
        fiber::scope(|s| f(Sc::F(s)))
    } else {
        std::thread::scope(|s| f(Sc::T(s)))
    }
}

/// A small xorshift generator (upstream uses fastrand).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng(seed | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// A value that counts its drops in a shared counter (per test run, so
/// the modes running in parallel do not share it).
#[derive(Debug)]
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// zero.rs: the rendezvous flavor, `bounded(0)`.

mod zero {
    use super::*;

    fn smoke() {
        let (s, r) = bounded(0);
        assert_eq!(s.try_send(7), Err(TrySendError::Full(7)));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    }

    fn capacity() {
        let (s, r) = bounded::<()>(0);
        assert_eq!(s.capacity(), Some(0));
        assert_eq!(r.capacity(), Some(0));
    }

    fn len_empty_full() {
        let (s, r) = bounded(0);
        let check = |s: &Sender<i32>, r: &Receiver<i32>| {
            assert_eq!((s.len(), s.is_empty(), s.is_full()), (0, true, true));
            assert_eq!((r.len(), r.is_empty(), r.is_full()), (0, true, true));
        };
        check(&s, &r);
        scope(|sc| {
            sc.spawn(|| s.send(0).unwrap());
            sc.spawn(|| r.recv().unwrap());
        });
        check(&s, &r);
    }

    fn try_recv() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
                sleep(ms(300));
                assert_eq!(r.try_recv(), Ok(7), "a parked sender's value is taken by try_recv");
                sleep(ms(100));
                assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));
            });
            sc.spawn(move || {
                sleep(ms(150));
                s.send(7).unwrap();
            });
        });
    }

    fn recv() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.recv(), Ok(7));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(8));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(9));
                assert_eq!(r.recv(), Err(RecvError));
            });
            sc.spawn(move || {
                sleep(ms(150));
                s.send(7).unwrap();
                s.send(8).unwrap();
                s.send(9).unwrap();
            });
        });
    }

    fn recv_timeout() {
        let (s, r) = bounded::<i32>(0);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.recv_timeout(ms(100)), Err(RecvTimeoutError::Timeout));
                assert_eq!(r.recv_timeout(ms(1000)), Ok(7));
                assert_eq!(r.recv_timeout(ms(1000)), Err(RecvTimeoutError::Disconnected));
            });
            sc.spawn(move || {
                sleep(ms(250));
                s.send(7).unwrap();
            });
        });
    }

    fn try_send() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(s.try_send(7), Err(TrySendError::Full(7)));
                sleep(ms(300));
                assert_eq!(s.try_send(8), Ok(()), "try_send hands to a parked receiver");
                sleep(ms(100));
                assert_eq!(s.try_send(9), Err(TrySendError::Disconnected(9)));
            });
            sc.spawn(move || {
                sleep(ms(150));
                assert_eq!(r.recv(), Ok(8));
            });
        });
    }

    fn send() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                s.send(7).unwrap();
                sleep(ms(100));
                s.send(8).unwrap();
                sleep(ms(100));
                s.send(9).unwrap();
            });
            sc.spawn(move || {
                sleep(ms(150));
                assert_eq!(r.recv(), Ok(7));
                assert_eq!(r.recv(), Ok(8));
                assert_eq!(r.recv(), Ok(9));
            });
        });
    }

    fn send_timeout() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(s.send_timeout(7, ms(100)), Err(SendTimeoutError::Timeout(7)));
                assert_eq!(s.send_timeout(8, ms(1000)), Ok(()));
                assert_eq!(s.send_timeout(9, ms(1000)), Err(SendTimeoutError::Disconnected(9)));
            });
            sc.spawn(move || {
                sleep(ms(250));
                assert_eq!(r.recv(), Ok(8));
            });
        });
    }

    fn len() {
        const COUNT: usize = 2_000;
        let (s, r) = bounded(0);
        assert_eq!((s.len(), r.len()), (0, 0));
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    assert_eq!(r.recv(), Ok(i));
                    assert_eq!(r.len(), 0);
                }
            });
            sc.spawn(|| {
                for i in 0..COUNT {
                    s.send(i).unwrap();
                    assert_eq!(s.len(), 0);
                }
            });
        });
        assert_eq!((s.len(), r.len()), (0, 0));
    }

    fn disconnect_wakes_sender() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || assert_eq!(s.send(()), Err(SendError(()))));
            sc.spawn(move || {
                sleep(ms(100));
                drop(r);
            });
        });
    }

    fn disconnect_wakes_receiver() {
        let (s, r) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(move || assert_eq!(r.recv(), Err(RecvError)));
            sc.spawn(move || {
                sleep(ms(100));
                drop(s);
            });
        });
    }

    fn spsc() {
        const COUNT: usize = 10_000;
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                for i in 0..COUNT {
                    assert_eq!(r.recv(), Ok(i));
                }
                assert_eq!(r.recv(), Err(RecvError));
            });
            sc.spawn(move || {
                for i in 0..COUNT {
                    s.send(i).unwrap();
                }
            });
        });
    }

    pub(super) fn mpmc_with(cap: Option<usize>, count: usize) {
        const THREADS: usize = 4;
        let (s, r) = match cap {
            Some(c) => bounded::<usize>(c),
            None => unbounded::<usize>(),
        };
        let v = (0..count).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>();
        scope(|sc| {
            for _ in 0..THREADS {
                sc.spawn(|| {
                    for _ in 0..count {
                        let n = r.recv().unwrap();
                        v[n].fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            for _ in 0..THREADS {
                sc.spawn(|| {
                    for i in 0..count {
                        s.send(i).unwrap();
                    }
                });
            }
        });
        for c in v {
            assert_eq!(c.load(Ordering::SeqCst), THREADS);
        }
    }

    fn mpmc() {
        mpmc_with(Some(0), 2_000);
    }

    fn stress_oneshot() {
        for _ in 0..300 {
            let (s, r) = bounded(0);
            scope(|sc| {
                sc.spawn(|| r.recv().unwrap());
                sc.spawn(|| s.send(0).unwrap());
            });
        }
    }

    fn stress_iter() {
        const COUNT: usize = 300;
        let (request_s, request_r) = bounded(0);
        let (response_s, response_r) = bounded(0);
        scope(|sc| {
            sc.spawn(move || {
                let mut count = 0;
                loop {
                    for x in response_r.try_iter() {
                        count += x;
                        if count == COUNT {
                            return;
                        }
                    }
                    let _ = request_s.try_send(());
                    relax();
                }
            });
            for _ in request_r.iter() {
                if response_s.send(1).is_err() {
                    break;
                }
            }
        });
    }

    pub(super) fn stress_timeout_two_threads_with(cap: usize) {
        const COUNT: usize = 40;
        let (s, r) = bounded(cap);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(10));
                    }
                    while s.send_timeout(i, ms(2)).is_err() {}
                }
            });
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(10));
                    }
                    loop {
                        if let Ok(x) = r.recv_timeout(ms(2)) {
                            assert_eq!(x, i);
                            break;
                        }
                    }
                }
            });
        });
    }

    fn stress_timeout_two_threads() {
        stress_timeout_two_threads_with(0);
    }

    fn drops() {
        let mut rng = Rng::new();
        for _ in 0..20 {
            let steps = rng.below(1_000);
            let drops = Arc::new(AtomicUsize::new(0));
            let (s, r) = bounded::<DropCounter>(0);
            scope(|sc| {
                sc.spawn(|| {
                    for _ in 0..steps {
                        r.recv().unwrap();
                    }
                });
                sc.spawn(|| {
                    for _ in 0..steps {
                        s.send(DropCounter(drops.clone())).unwrap();
                    }
                });
            });
            assert_eq!(drops.load(Ordering::SeqCst), steps);
            drop(s);
            drop(r);
            assert_eq!(drops.load(Ordering::SeqCst), steps);
        }
    }

    fn fairness() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded::<()>(0);
        let (s2, r2) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(|| {
                let mut hits = [0usize; 2];
                for _ in 0..COUNT {
                    select! {
                        recv(r1) -> _ => hits[0] += 1,
                        recv(r2) -> _ => hits[1] += 1,
                    }
                }
                assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "receiving {hits:?}");
            });
            let mut hits = [0usize; 2];
            for _ in 0..COUNT {
                select! {
                    send(s1, ()) -> _ => hits[0] += 1,
                    send(s2, ()) -> _ => hits[1] += 1,
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "sending {hits:?}");
        });
    }

    fn fairness_duplicates() {
        const COUNT: usize = 2_000;
        let (s, r) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(|| {
                let mut hits = [0usize; 5];
                for _ in 0..COUNT {
                    select! {
                        recv(r) -> _ => hits[0] += 1,
                        recv(r) -> _ => hits[1] += 1,
                        recv(r) -> _ => hits[2] += 1,
                        recv(r) -> _ => hits[3] += 1,
                        recv(r) -> _ => hits[4] += 1,
                    }
                }
                assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "receiving {hits:?}");
            });
            let mut hits = [0usize; 5];
            for _ in 0..COUNT {
                select! {
                    send(s, ()) -> _ => hits[0] += 1,
                    send(s, ()) -> _ => hits[1] += 1,
                    send(s, ()) -> _ => hits[2] += 1,
                    send(s, ()) -> _ => hits[3] += 1,
                    send(s, ()) -> _ => hits[4] += 1,
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "sending {hits:?}");
        });
    }

    // The send arm's value expression receives from the very channel the
    // arm sends on: a third party sends the value, a second receives the
    // one the arm sends.
    fn recv_in_send() {
        let (s, r) = bounded(0);
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(20));
                r.recv()
            });
            sc.spawn(|| {
                sleep(ms(100));
                s.send(()).unwrap();
            });
            select! {
                send(s, r.recv().unwrap()) -> res => res.unwrap(),
            }
        });
    }

    pub(super) fn channel_through_channel_with(cap: usize) {
        const COUNT: usize = 300;
        type T = Box<dyn Any + Send>;
        let (s, r) = bounded::<T>(cap);
        scope(|sc| {
            sc.spawn(move || {
                let mut s = s;
                for _ in 0..COUNT {
                    let (new_s, new_r) = bounded(cap);
                    let new_r: T = Box::new(Some(new_r));
                    s.send(new_r).unwrap();
                    s = new_s;
                }
            });
            sc.spawn(move || {
                let mut r = r;
                for _ in 0..COUNT {
                    r = r
                        .recv()
                        .unwrap()
                        .downcast_mut::<Option<Receiver<T>>>()
                        .unwrap()
                        .take()
                        .unwrap()
                }
            });
        });
    }

    fn channel_through_channel() {
        channel_through_channel_with(0);
    }

    port!(
        smoke,
        capacity,
        len_empty_full,
        try_recv,
        recv,
        recv_timeout,
        try_send,
        send,
        send_timeout,
        len,
        disconnect_wakes_sender,
        disconnect_wakes_receiver,
        spsc,
        mpmc,
        stress_oneshot,
        stress_iter,
        stress_timeout_two_threads,
        drops,
        fairness,
        fairness_duplicates,
        recv_in_send,
        channel_through_channel,
    );
}

// ---------------------------------------------------------------------------
// array.rs: the bounded flavor, `bounded(n > 0)`.

mod array {
    use super::*;

    fn smoke() {
        let (s, r) = bounded(1);
        s.send(7).unwrap();
        assert_eq!(r.try_recv(), Ok(7));
        s.send(8).unwrap();
        assert_eq!(r.recv(), Ok(8));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(r.recv_timeout(ms(50)), Err(RecvTimeoutError::Timeout));
    }

    fn capacity() {
        for i in 1..10 {
            let (s, r) = bounded::<()>(i);
            assert_eq!(s.capacity(), Some(i));
            assert_eq!(r.capacity(), Some(i));
        }
    }

    fn len_empty_full() {
        let (s, r) = bounded(2);
        let check = |len, empty, full| {
            assert_eq!((s.len(), s.is_empty(), s.is_full()), (len, empty, full));
            assert_eq!((r.len(), r.is_empty(), r.is_full()), (len, empty, full));
        };
        check(0, true, false);
        s.send(()).unwrap();
        check(1, false, false);
        s.send(()).unwrap();
        check(2, false, true);
        r.recv().unwrap();
        check(1, false, false);
    }

    fn try_recv() {
        let (s, r) = bounded(100);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
                sleep(ms(300));
                assert_eq!(r.try_recv(), Ok(7));
                sleep(ms(100));
                assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));
            });
            sc.spawn(move || {
                sleep(ms(150));
                s.send(7).unwrap();
            });
        });
    }

    fn recv() {
        let (s, r) = bounded(100);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.recv(), Ok(7));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(8));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(9));
                assert_eq!(r.recv(), Err(RecvError));
            });
            sc.spawn(move || {
                sleep(ms(150));
                s.send(7).unwrap();
                s.send(8).unwrap();
                s.send(9).unwrap();
            });
        });
    }

    fn recv_timeout() {
        let (s, r) = bounded::<i32>(100);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.recv_timeout(ms(100)), Err(RecvTimeoutError::Timeout));
                assert_eq!(r.recv_timeout(ms(1000)), Ok(7));
                assert_eq!(r.recv_timeout(ms(1000)), Err(RecvTimeoutError::Disconnected));
            });
            sc.spawn(move || {
                sleep(ms(250));
                s.send(7).unwrap();
            });
        });
    }

    fn try_send() {
        let (s, r) = bounded(1);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(s.try_send(1), Ok(()));
                assert_eq!(s.try_send(2), Err(TrySendError::Full(2)));
                sleep(ms(300));
                assert_eq!(s.try_send(3), Ok(()));
                sleep(ms(100));
                assert_eq!(s.try_send(4), Err(TrySendError::Disconnected(4)));
            });
            sc.spawn(move || {
                sleep(ms(150));
                assert_eq!(r.try_recv(), Ok(1));
                assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
                assert_eq!(r.recv(), Ok(3));
            });
        });
    }

    // The sender's last send stays parked on the full channel until the
    // scope ends, where the receiver's drop fails it: upstream ignores
    // the outcome of that send; here it must be Err (receiver gone).
    fn send() {
        let (s, r) = bounded(1);
        scope(|sc| {
            sc.spawn(move || {
                s.send(7).unwrap();
                sleep(ms(100));
                s.send(8).unwrap();
                sleep(ms(100));
                s.send(9).unwrap();
                sleep(ms(100));
                let _ = s.send(10);
            });
            sc.spawn(move || {
                sleep(ms(150));
                assert_eq!(r.recv(), Ok(7));
                assert_eq!(r.recv(), Ok(8));
                assert_eq!(r.recv(), Ok(9));
            });
        });
    }

    fn send_timeout() {
        let (s, r) = bounded(2);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(s.send_timeout(1, ms(1000)), Ok(()));
                assert_eq!(s.send_timeout(2, ms(1000)), Ok(()));
                assert_eq!(s.send_timeout(3, ms(50)), Err(SendTimeoutError::Timeout(3)));
                sleep(ms(200));
                assert_eq!(s.send_timeout(4, ms(1000)), Ok(()));
                sleep(ms(200));
                assert_eq!(s.send(5), Err(SendError(5)));
            });
            sc.spawn(move || {
                sleep(ms(200));
                assert_eq!(r.recv(), Ok(1));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(2));
                assert_eq!(r.recv(), Ok(4));
            });
        });
    }

    pub(super) fn send_after_disconnect_with(s: Sender<i32>, r: Receiver<i32>) {
        s.send(1).unwrap();
        s.send(2).unwrap();
        s.send(3).unwrap();
        drop(r);
        assert_eq!(s.send(4), Err(SendError(4)));
        assert_eq!(s.try_send(5), Err(TrySendError::Disconnected(5)));
        assert_eq!(s.send_timeout(6, ms(500)), Err(SendTimeoutError::Disconnected(6)));
    }

    fn send_after_disconnect() {
        let (s, r) = bounded(100);
        send_after_disconnect_with(s, r);
    }

    pub(super) fn recv_after_disconnect_with(s: Sender<i32>, r: Receiver<i32>) {
        s.send(1).unwrap();
        s.send(2).unwrap();
        s.send(3).unwrap();
        drop(s);
        assert_eq!(r.recv(), Ok(1));
        assert_eq!(r.recv(), Ok(2));
        assert_eq!(r.recv(), Ok(3));
        assert_eq!(r.recv(), Err(RecvError));
    }

    fn recv_after_disconnect() {
        let (s, r) = bounded(100);
        recv_after_disconnect_with(s, r);
    }

    fn len() {
        const COUNT: usize = 5_000;
        const CAP: usize = 1000;
        let (s, r) = bounded(CAP);
        assert_eq!((s.len(), r.len()), (0, 0));
        for _ in 0..CAP / 10 {
            for i in 0..50 {
                s.send(i).unwrap();
                assert_eq!(s.len(), i + 1);
            }
            for i in 0..50 {
                r.recv().unwrap();
                assert_eq!(r.len(), 50 - i - 1);
            }
        }
        assert_eq!((s.len(), r.len()), (0, 0));
        for i in 0..CAP {
            s.send(i).unwrap();
            assert_eq!(s.len(), i + 1);
        }
        for _ in 0..CAP {
            r.recv().unwrap();
        }
        assert_eq!((s.len(), r.len()), (0, 0));
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    assert_eq!(r.recv(), Ok(i));
                    assert!(r.len() <= CAP);
                }
            });
            sc.spawn(|| {
                for i in 0..COUNT {
                    s.send(i).unwrap();
                    assert!(s.len() <= CAP);
                }
            });
        });
        assert_eq!((s.len(), r.len()), (0, 0));
    }

    fn disconnect_wakes_sender() {
        let (s, r) = bounded(1);
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(s.send(()), Ok(()));
                assert_eq!(s.send(()), Err(SendError(())));
            });
            sc.spawn(move || {
                sleep(ms(100));
                drop(r);
            });
        });
    }

    fn disconnect_wakes_receiver() {
        let (s, r) = bounded::<()>(1);
        scope(|sc| {
            sc.spawn(move || assert_eq!(r.recv(), Err(RecvError)));
            sc.spawn(move || {
                sleep(ms(100));
                drop(s);
            });
        });
    }

    fn spsc() {
        const COUNT: usize = 20_000;
        let (s, r) = bounded(3);
        scope(|sc| {
            sc.spawn(move || {
                for i in 0..COUNT {
                    assert_eq!(r.recv(), Ok(i));
                }
                assert_eq!(r.recv(), Err(RecvError));
            });
            sc.spawn(move || {
                for i in 0..COUNT {
                    s.send(i).unwrap();
                }
            });
        });
    }

    fn mpmc() {
        zero::mpmc_with(Some(3), 5_000);
    }

    fn stress_oneshot() {
        for _ in 0..300 {
            let (s, r) = bounded(1);
            scope(|sc| {
                sc.spawn(|| r.recv().unwrap());
                sc.spawn(|| s.send(0).unwrap());
            });
        }
    }

    pub(super) fn stress_iter_with(request: (Sender<()>, Receiver<()>), response: (Sender<usize>, Receiver<usize>)) {
        const COUNT: usize = 5_000;
        let (request_s, request_r) = request;
        let (response_s, response_r) = response;
        scope(|sc| {
            sc.spawn(move || {
                let mut count = 0;
                loop {
                    for x in response_r.try_iter() {
                        count += x;
                        if count == COUNT {
                            return;
                        }
                    }
                    request_s.send(()).unwrap();
                    relax();
                }
            });
            for _ in request_r.iter() {
                if response_s.send(1).is_err() {
                    break;
                }
            }
        });
    }

    fn stress_iter() {
        stress_iter_with(bounded(1), bounded(1));
    }

    fn stress_timeout_two_threads() {
        zero::stress_timeout_two_threads_with(2);
    }

    fn drops() {
        let mut rng = Rng::new();
        for _ in 0..20 {
            let steps = rng.below(1_000);
            let additional = rng.below(50);
            let drops = Arc::new(AtomicUsize::new(0));
            let (s, r) = bounded::<DropCounter>(50);
            scope(|sc| {
                sc.spawn(|| {
                    for _ in 0..steps {
                        r.recv().unwrap();
                    }
                });
                sc.spawn(|| {
                    for _ in 0..steps {
                        s.send(DropCounter(drops.clone())).unwrap();
                    }
                });
            });
            for _ in 0..additional {
                s.send(DropCounter(drops.clone())).unwrap();
            }
            assert_eq!(drops.load(Ordering::SeqCst), steps);
            drop(s);
            drop(r);
            assert_eq!(drops.load(Ordering::SeqCst), steps + additional);
        }
    }

    pub(super) fn linearizable_with(s: Sender<i32>, r: Receiver<i32>) {
        const COUNT: usize = 5_000;
        const THREADS: usize = 4;
        scope(|sc| {
            for _ in 0..THREADS {
                sc.spawn(|| {
                    for _ in 0..COUNT {
                        s.send(0).unwrap();
                        r.try_recv().unwrap();
                    }
                });
            }
        });
    }

    fn linearizable() {
        let (s, r) = bounded(4);
        linearizable_with(s, r);
    }

    pub(super) fn fairness_with(a: (Sender<()>, Receiver<()>), b: (Sender<()>, Receiver<()>), count: usize) {
        let ((s1, r1), (s2, r2)) = (a, b);
        for _ in 0..count {
            s1.send(()).unwrap();
            s2.send(()).unwrap();
        }
        let mut hits = [0usize; 2];
        for _ in 0..count {
            select! {
                recv(r1) -> _ => hits[0] += 1,
                recv(r2) -> _ => hits[1] += 1,
            }
        }
        assert!(hits.iter().all(|x| *x >= count / hits.len() / 2), "{hits:?}");
    }

    fn fairness() {
        fairness_with(bounded(5_000), bounded(5_000), 5_000);
    }

    pub(super) fn fairness_duplicates_with(s: Sender<()>, r: Receiver<()>, count: usize) {
        for _ in 0..count {
            s.send(()).unwrap();
        }
        let mut hits = [0usize; 5];
        for _ in 0..count {
            select! {
                recv(r) -> _ => hits[0] += 1,
                recv(r) -> _ => hits[1] += 1,
                recv(r) -> _ => hits[2] += 1,
                recv(r) -> _ => hits[3] += 1,
                recv(r) -> _ => hits[4] += 1,
            }
        }
        assert!(hits.iter().all(|x| *x >= count / hits.len() / 2), "{hits:?}");
    }

    fn fairness_duplicates() {
        let (s, r) = bounded(5_000);
        fairness_duplicates_with(s, r, 5_000);
    }

    fn recv_in_send() {
        // A full channel: the send arm is not ready, its value (a panic)
        // is never evaluated, the default runs.
        let (s, _r) = bounded(1);
        s.send(()).unwrap();
        select! {
            send(s, panic!("evaluated the value of a send arm that was not selected")) -> _ => panic!(),
            default => {}
        }
        // The value expression may receive from the channel it sends on.
        let (s, r) = bounded(2);
        s.send(()).unwrap();
        select! {
            send(s, assert_eq!(r.recv(), Ok(()))) -> res => res.unwrap(),
        }
        assert_eq!(r.try_recv(), Ok(()));
    }

    fn channel_through_channel() {
        zero::channel_through_channel_with(1);
    }

    // Upstream asserts that after the first panicking destructor the rest
    // leak; fiber documents dropping every value once and re-raising the
    // first panic (spec/chan.md, "Where fiber differs"). Checked here:
    // the first panic is re-raised, no value is dropped twice.
    fn panic_on_drop() {
        struct Msg1(Arc<AtomicUsize>);
        impl Drop for Msg1 {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        struct Msg2(Arc<AtomicUsize>);
        impl Drop for Msg2 {
            fn drop(&mut self) {
                if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                    panic!("first drop");
                }
            }
        }
        let (s, r) = bounded(2);
        let (a, b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        s.send(Msg1(a.clone())).unwrap();
        s.send(Msg1(b.clone())).unwrap();
        drop(s);
        drop(r);
        assert_eq!((a.load(Ordering::SeqCst), b.load(Ordering::SeqCst)), (1, 1));

        let (s, r) = bounded(2);
        let n = Arc::new(AtomicUsize::new(0));
        s.send(Msg2(n.clone())).unwrap();
        s.send(Msg2(n.clone())).unwrap();
        drop(s);
        let res = catch_unwind(AssertUnwindSafe(move || drop(r)));
        assert_eq!(panic_text(&*res.unwrap_err()), "first drop");
        assert!(
            n.load(Ordering::SeqCst) >= 1 && n.load(Ordering::SeqCst) <= 2,
            "no double drop"
        );
    }

    // Messages are dropped as soon as the last receiver is (crossbeam:
    // `drop_unreceived`; upstream uses `Rc`, here an `Arc`'s weak count).
    fn drop_unreceived() {
        let (tx, rx) = bounded::<Arc<()>>(1);
        let msg = Arc::new(());
        let weak = Arc::downgrade(&msg);
        assert!(tx.send(msg).is_ok());
        drop(rx);
        assert!(
            weak.upgrade().is_none(),
            "the buffered message outlived the last receiver"
        );
        drop(tx);
    }

    port!(
        smoke,
        capacity,
        len_empty_full,
        try_recv,
        recv,
        recv_timeout,
        try_send,
        send,
        send_timeout,
        send_after_disconnect,
        recv_after_disconnect,
        len,
        disconnect_wakes_sender,
        disconnect_wakes_receiver,
        spsc,
        mpmc,
        stress_oneshot,
        stress_iter,
        stress_timeout_two_threads,
        drops,
        linearizable,
        fairness,
        fairness_duplicates,
        recv_in_send,
        channel_through_channel,
        panic_on_drop,
        drop_unreceived,
    );
}

// ---------------------------------------------------------------------------
// list.rs: the unbounded flavor.

mod list {
    use super::*;

    fn smoke() {
        let (s, r) = unbounded();
        s.try_send(7).unwrap();
        assert_eq!(r.try_recv(), Ok(7));
        s.send(8).unwrap();
        assert_eq!(r.recv(), Ok(8));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
        assert_eq!(r.recv_timeout(ms(50)), Err(RecvTimeoutError::Timeout));
    }

    fn capacity() {
        let (s, r) = unbounded::<()>();
        assert_eq!(s.capacity(), None);
        assert_eq!(r.capacity(), None);
    }

    fn len_empty_full() {
        let (s, r) = unbounded();
        let check = |len, empty| {
            assert_eq!((s.len(), s.is_empty(), s.is_full()), (len, empty, false));
            assert_eq!((r.len(), r.is_empty(), r.is_full()), (len, empty, false));
        };
        check(0, true);
        s.send(()).unwrap();
        check(1, false);
        r.recv().unwrap();
        check(0, true);
    }

    fn try_recv() {
        let (s, r) = unbounded();
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
                sleep(ms(300));
                assert_eq!(r.try_recv(), Ok(7));
                sleep(ms(100));
                assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));
            });
            sc.spawn(move || {
                sleep(ms(150));
                s.send(7).unwrap();
            });
        });
    }

    fn recv() {
        let (s, r) = unbounded();
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.recv(), Ok(7));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(8));
                sleep(ms(100));
                assert_eq!(r.recv(), Ok(9));
                assert_eq!(r.recv(), Err(RecvError));
            });
            sc.spawn(move || {
                sleep(ms(150));
                s.send(7).unwrap();
                s.send(8).unwrap();
                s.send(9).unwrap();
            });
        });
    }

    fn recv_timeout() {
        let (s, r) = unbounded::<i32>();
        scope(|sc| {
            sc.spawn(move || {
                assert_eq!(r.recv_timeout(ms(100)), Err(RecvTimeoutError::Timeout));
                assert_eq!(r.recv_timeout(ms(1000)), Ok(7));
                assert_eq!(r.recv_timeout(ms(1000)), Err(RecvTimeoutError::Disconnected));
            });
            sc.spawn(move || {
                sleep(ms(250));
                s.send(7).unwrap();
            });
        });
    }

    // A value already buffered is taken even by a zero (already elapsed)
    // timeout; with nothing buffered it times out.
    fn recv_timeout_nonempty_expired() {
        let (s, r) = unbounded::<i32>();
        s.send(5).unwrap();
        assert_eq!(r.recv_timeout(ms(0)), Ok(5));
        assert_eq!(r.recv_timeout(ms(0)), Err(RecvTimeoutError::Timeout));
        // The same for every other flavor, and for a deadline in the past.
        let (s, r) = bounded::<i32>(1);
        s.send(6).unwrap();
        assert_eq!(r.recv_timeout(ms(0)), Ok(6));
        s.send(7).unwrap();
        assert_eq!(r.recv_deadline(Instant::now() - ms(10)), Ok(7));
        assert_eq!(r.recv_deadline(Instant::now() - ms(10)), Err(RecvTimeoutError::Timeout));
    }

    fn try_send() {
        let (s, r) = unbounded();
        for i in 0..1000 {
            assert_eq!(s.try_send(i), Ok(()));
        }
        drop(r);
        assert_eq!(s.try_send(777), Err(TrySendError::Disconnected(777)));
    }

    fn send() {
        let (s, r) = unbounded();
        for i in 0..1000 {
            assert_eq!(s.send(i), Ok(()));
        }
        drop(r);
        assert_eq!(s.send(777), Err(SendError(777)));
    }

    fn send_timeout() {
        let (s, r) = unbounded();
        for i in 0..1000 {
            assert_eq!(s.send_timeout(i, ms(i as u64)), Ok(()));
        }
        drop(r);
        assert_eq!(s.send_timeout(777, ms(0)), Err(SendTimeoutError::Disconnected(777)));
    }

    fn send_after_disconnect() {
        let (s, r) = unbounded();
        array::send_after_disconnect_with(s, r);
    }

    fn recv_after_disconnect() {
        let (s, r) = unbounded();
        array::recv_after_disconnect_with(s, r);
    }

    fn len() {
        let (s, r) = unbounded();
        assert_eq!((s.len(), r.len()), (0, 0));
        for i in 0..50 {
            s.send(i).unwrap();
            assert_eq!(s.len(), i + 1);
        }
        for i in 0..50 {
            r.recv().unwrap();
            assert_eq!(r.len(), 50 - i - 1);
        }
        assert_eq!((s.len(), r.len()), (0, 0));
    }

    fn disconnect_wakes_receiver() {
        let (s, r) = unbounded::<()>();
        scope(|sc| {
            sc.spawn(move || assert_eq!(r.recv(), Err(RecvError)));
            sc.spawn(move || {
                sleep(ms(100));
                drop(s);
            });
        });
    }

    fn spsc() {
        const COUNT: usize = 20_000;
        let (s, r) = unbounded();
        scope(|sc| {
            sc.spawn(move || {
                for i in 0..COUNT {
                    assert_eq!(r.recv(), Ok(i));
                }
                assert_eq!(r.recv(), Err(RecvError));
            });
            sc.spawn(move || {
                for i in 0..COUNT {
                    s.send(i).unwrap();
                }
            });
        });
    }

    fn mpmc() {
        zero::mpmc_with(None, 5_000);
    }

    fn stress_oneshot() {
        for _ in 0..300 {
            let (s, r) = unbounded();
            scope(|sc| {
                sc.spawn(|| r.recv().unwrap());
                sc.spawn(|| s.send(0).unwrap());
            });
        }
    }

    fn stress_iter() {
        array::stress_iter_with(unbounded(), unbounded());
    }

    fn stress_timeout_two_threads() {
        const COUNT: usize = 40;
        let (s, r) = unbounded();
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(10));
                    }
                    s.send(i).unwrap();
                }
            });
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(10));
                    }
                    loop {
                        if let Ok(x) = r.recv_timeout(ms(2)) {
                            assert_eq!(x, i);
                            break;
                        }
                    }
                }
            });
        });
    }

    fn drops() {
        let mut rng = Rng::new();
        for _ in 0..20 {
            let steps = rng.below(1_000);
            let additional = rng.below(100);
            let drops = Arc::new(AtomicUsize::new(0));
            let (s, r) = unbounded::<DropCounter>();
            scope(|sc| {
                sc.spawn(|| {
                    for _ in 0..steps {
                        r.recv().unwrap();
                    }
                });
                sc.spawn(|| {
                    for _ in 0..steps {
                        s.send(DropCounter(drops.clone())).unwrap();
                    }
                });
            });
            for _ in 0..additional {
                s.try_send(DropCounter(drops.clone())).unwrap();
            }
            assert_eq!(drops.load(Ordering::SeqCst), steps);
            drop(s);
            drop(r);
            assert_eq!(drops.load(Ordering::SeqCst), steps + additional);
        }
    }

    fn linearizable() {
        let (s, r) = unbounded();
        array::linearizable_with(s, r);
    }

    fn fairness() {
        array::fairness_with(unbounded(), unbounded(), 5_000);
    }

    fn fairness_duplicates() {
        let (s, r) = unbounded();
        array::fairness_duplicates_with(s, r, 5_000);
    }

    fn recv_in_send() {
        let (s, r) = unbounded();
        s.send(()).unwrap();
        select! {
            send(s, assert_eq!(r.recv(), Ok(()))) -> res => res.unwrap(),
        }
        assert_eq!(r.try_recv(), Ok(()));
    }

    fn channel_through_channel() {
        const COUNT: usize = 300;
        type T = Box<dyn Any + Send>;
        let (s, r) = unbounded::<T>();
        scope(|sc| {
            sc.spawn(move || {
                let mut s = s;
                for _ in 0..COUNT {
                    let (new_s, new_r) = unbounded();
                    let new_r: T = Box::new(Some(new_r));
                    s.send(new_r).unwrap();
                    s = new_s;
                }
            });
            sc.spawn(move || {
                let mut r = r;
                for _ in 0..COUNT {
                    r = r
                        .recv()
                        .unwrap()
                        .downcast_mut::<Option<Receiver<T>>>()
                        .unwrap()
                        .take()
                        .unwrap()
                }
            });
        });
    }

    // A 32 KiB message through an unbounded channel must not overflow a
    // stack (upstream: the block of slots is made on the heap). Here it
    // also runs on a fiber's stack.
    fn stack_overflow() {
        const N: usize = 32_768;
        struct BigStruct {
            _data: [u8; N],
        }
        let (sender, receiver) = unbounded::<BigStruct>();
        sender.send(BigStruct { _data: [0u8; N] }).unwrap();
        let mut n = 0;
        for _data in receiver.try_iter() {
            n += 1;
        }
        assert_eq!(n, 1);
    }

    port!(
        smoke,
        capacity,
        len_empty_full,
        try_recv,
        recv,
        recv_timeout,
        recv_timeout_nonempty_expired,
        try_send,
        send,
        send_timeout,
        send_after_disconnect,
        recv_after_disconnect,
        len,
        disconnect_wakes_receiver,
        spsc,
        mpmc,
        stress_oneshot,
        stress_iter,
        stress_timeout_two_threads,
        drops,
        linearizable,
        fairness,
        fairness_duplicates,
        recv_in_send,
        channel_through_channel,
    );

    mod stack_overflow {
        #[test]
        fn threads() {
            crate::three_ways::run(crate::three_ways::Mode::Threads, super::stack_overflow)
        }
        #[test]
        fn fibers_1w() {
            crate::three_ways::run(crate::three_ways::Mode::Fibers1, super::stack_overflow)
        }
        #[test]
        fn fibers_2w() {
            crate::three_ways::run(crate::three_ways::Mode::Fibers2, super::stack_overflow)
        }
    }
}

// ---------------------------------------------------------------------------
// select.rs: the `Select` struct.

mod select_struct {
    use super::*;

    fn smoke1() {
        let (s1, r1) = unbounded::<usize>();
        let (s2, r2) = unbounded::<usize>();
        s1.send(1).unwrap();
        let mut sel = Select::new();
        let o1 = sel.recv(&r1);
        let _o2 = sel.recv(&r2);
        let oper = sel.select();
        assert_eq!(oper.index(), o1);
        assert_eq!(oper.recv(&r1), Ok(1));
        s2.send(2).unwrap();
        let mut sel = Select::new();
        let _o1 = sel.recv(&r1);
        let o2 = sel.recv(&r2);
        let oper = sel.select();
        assert_eq!(oper.index(), o2);
        assert_eq!(oper.recv(&r2), Ok(2));
    }

    fn smoke2() {
        let (_s1, r1) = unbounded::<i32>();
        let (_s2, r2) = unbounded::<i32>();
        let (_s3, r3) = unbounded::<i32>();
        let (_s4, r4) = unbounded::<i32>();
        let (s5, r5) = unbounded::<i32>();
        s5.send(5).unwrap();
        let mut sel = Select::new();
        for r in [&r1, &r2, &r3, &r4] {
            sel.recv(r);
        }
        let o5 = sel.recv(&r5);
        let oper = sel.select();
        assert_eq!(oper.index(), o5);
        assert_eq!(oper.recv(&r5), Ok(5));
    }

    fn disconnected() {
        let (s1, r1) = unbounded::<i32>();
        let (s2, r2) = unbounded::<i32>();
        scope(|sc| {
            sc.spawn(|| {
                drop(s1);
                sleep(ms(100));
                s2.send(5).unwrap();
            });
            let mut sel = Select::new();
            let o1 = sel.recv(&r1);
            sel.recv(&r2);
            let oper = sel.select_timeout(ms(1000)).expect("the disconnected channel is ready");
            assert_eq!(oper.index(), o1);
            assert!(oper.recv(&r1).is_err());
            r2.recv().unwrap();
        });
        let mut sel = Select::new();
        let o1 = sel.recv(&r1);
        sel.recv(&r2);
        let oper = sel.select_timeout(ms(1000)).unwrap();
        assert_eq!(oper.index(), o1);
        assert!(oper.recv(&r1).is_err());
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(100));
                drop(s2);
            });
            let mut sel = Select::new();
            let o = sel.recv(&r2);
            let oper = sel.select_timeout(ms(1000)).expect("woken by the disconnection");
            assert_eq!(oper.index(), o);
            assert!(oper.recv(&r2).is_err());
        });
    }

    fn default() {
        let (s1, r1) = unbounded::<i32>();
        let (s2, r2) = unbounded::<i32>();
        let mut sel = Select::new();
        sel.recv(&r1);
        sel.recv(&r2);
        assert!(sel.try_select().is_err());
        drop(s1);
        let mut sel = Select::new();
        let o1 = sel.recv(&r1);
        sel.recv(&r2);
        let oper = sel.try_select().unwrap();
        assert_eq!(oper.index(), o1);
        assert!(oper.recv(&r1).is_err());
        s2.send(2).unwrap();
        let mut sel = Select::new();
        let o = sel.recv(&r2);
        let oper = sel.try_select().unwrap();
        assert_eq!(oper.index(), o);
        assert_eq!(oper.recv(&r2), Ok(2));
        let mut sel = Select::new();
        sel.recv(&r2);
        assert!(sel.try_select().is_err());
        let mut sel = Select::new();
        assert!(sel.try_select().is_err());
    }

    fn timeout() {
        let (_s1, r1) = unbounded::<i32>();
        let (s2, r2) = unbounded::<i32>();
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(300));
                s2.send(2).unwrap();
            });
            let mut sel = Select::new();
            sel.recv(&r1);
            sel.recv(&r2);
            assert!(sel.select_timeout(ms(100)).is_err());
            let mut sel = Select::new();
            sel.recv(&r1);
            let o2 = sel.recv(&r2);
            let oper = sel.select_timeout(ms(2000)).unwrap();
            assert_eq!(oper.index(), o2);
            assert_eq!(oper.recv(&r2), Ok(2));
        });
        scope(|sc| {
            let (s, r) = unbounded::<i32>();
            sc.spawn(move || {
                sleep(ms(50));
                drop(s);
            });
            // An empty select times out (it has nothing to wait for).
            let mut sel = Select::new();
            assert!(sel.select_timeout(ms(100)).is_err());
            let mut sel = Select::new();
            let o = sel.recv(&r);
            let oper = sel.try_select().unwrap();
            assert_eq!(oper.index(), o);
            assert!(oper.recv(&r).is_err());
        });
    }

    fn default_when_disconnected() {
        let (_, r) = unbounded::<i32>();
        let mut sel = Select::new();
        let o = sel.recv(&r);
        let oper = sel.try_select().unwrap();
        assert_eq!(oper.index(), o);
        assert!(oper.recv(&r).is_err());

        let (_, r) = unbounded::<i32>();
        let mut sel = Select::new();
        let o = sel.recv(&r);
        let oper = sel.select_timeout(ms(1000)).unwrap();
        assert_eq!(oper.index(), o);
        assert!(oper.recv(&r).is_err());

        let (s, _) = bounded::<i32>(0);
        let mut sel = Select::new();
        let o = sel.send(&s);
        let oper = sel.try_select().unwrap();
        assert_eq!(oper.index(), o);
        assert!(oper.send(&s, 0).is_err());

        let (s, _) = bounded::<i32>(0);
        let mut sel = Select::new();
        let o = sel.send(&s);
        let oper = sel.select_timeout(ms(1000)).unwrap();
        assert_eq!(oper.index(), o);
        assert!(oper.send(&s, 0).is_err());
    }

    fn default_only() {
        let start = Instant::now();
        let mut sel = Select::new();
        assert!(sel.try_select().is_err());
        assert!(start.elapsed() <= ms(500));
        let start = Instant::now();
        let mut sel = Select::new();
        assert!(sel.select_timeout(ms(100)).is_err());
        let took = start.elapsed();
        assert!(took >= ms(100), "returned early: {took:?}");
        assert!(took <= ms(1500), "far too late: {took:?}");
    }

    fn unblocks() {
        let (s1, r1) = bounded::<i32>(0);
        let (s2, r2) = bounded::<i32>(0);
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(100));
                s2.send(2).unwrap();
            });
            let mut sel = Select::new();
            sel.recv(&r1);
            let o2 = sel.recv(&r2);
            let oper = sel.select_timeout(ms(2000)).unwrap();
            assert_eq!(oper.index(), o2);
            assert_eq!(oper.recv(&r2), Ok(2));
        });
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(100));
                assert_eq!(r1.recv().unwrap(), 1);
            });
            let mut sel = Select::new();
            let o1 = sel.send(&s1);
            sel.send(&s2);
            let oper = sel.select_timeout(ms(2000)).unwrap();
            assert_eq!(oper.index(), o1);
            oper.send(&s1, 1).unwrap();
        });
    }

    fn both_ready() {
        let (s1, r1) = bounded(0);
        let (s2, r2) = bounded(0);
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(100));
                s1.send(1).unwrap();
                assert_eq!(r2.recv().unwrap(), 2);
            });
            for _ in 0..2 {
                let mut sel = Select::new();
                let o1 = sel.recv(&r1);
                let o2 = sel.send(&s2);
                let oper = sel.select();
                match oper.index() {
                    i if i == o1 => assert_eq!(oper.recv(&r1), Ok(1)),
                    i if i == o2 => oper.send(&s2, 2).unwrap(),
                    _ => unreachable!(),
                }
            }
        });
    }

    fn loop_try() {
        for _ in 0..10 {
            let (s1, r1) = bounded::<i32>(0);
            let (s2, r2) = bounded::<i32>(0);
            let (s_end, r_end) = bounded::<()>(0);
            scope(|sc| {
                sc.spawn(|| loop {
                    let mut sel = Select::new();
                    sel.send(&s1);
                    if let Ok(oper) = sel.try_select() {
                        let _ = oper.send(&s1, 1);
                        break;
                    }
                    let mut sel = Select::new();
                    sel.recv(&r_end);
                    if let Ok(oper) = sel.try_select() {
                        let _ = oper.recv(&r_end);
                        break;
                    }
                    relax();
                });
                sc.spawn(|| loop {
                    if let Ok(x) = r2.try_recv() {
                        assert_eq!(x, 2);
                        break;
                    }
                    let mut sel = Select::new();
                    sel.recv(&r_end);
                    if let Ok(oper) = sel.try_select() {
                        let _ = oper.recv(&r_end);
                        break;
                    }
                    relax();
                });
                sc.spawn(|| {
                    sleep(ms(20));
                    let mut sel = Select::new();
                    let o1 = sel.recv(&r1);
                    let o2 = sel.send(&s2);
                    if let Ok(oper) = sel.select_timeout(ms(200)) {
                        match oper.index() {
                            i if i == o1 => assert_eq!(oper.recv(&r1), Ok(1)),
                            i if i == o2 => assert!(oper.send(&s2, 2).is_ok()),
                            _ => unreachable!(),
                        }
                    }
                    drop(s_end);
                });
            });
        }
    }

    fn cloning1() {
        scope(|sc| {
            let (s1, r1) = unbounded::<i32>();
            let (_s2, r2) = unbounded::<i32>();
            let (s3, r3) = unbounded::<()>();
            sc.spawn(move || {
                r3.recv().unwrap();
                drop(s1.clone());
                assert!(r3.try_recv().is_err());
                s1.send(1).unwrap();
                r3.recv().unwrap();
            });
            s3.send(()).unwrap();
            let mut sel = Select::new();
            let o1 = sel.recv(&r1);
            sel.recv(&r2);
            let oper = sel.select();
            assert_eq!(oper.index(), o1, "dropping a clone of a sender is not a disconnection");
            assert_eq!(oper.recv(&r1), Ok(1));
            s3.send(()).unwrap();
        });
    }

    fn cloning2() {
        let (s1, r1) = unbounded::<()>();
        let (s2, r2) = unbounded::<()>();
        let (_s3, _r3) = unbounded::<()>();
        scope(|sc| {
            sc.spawn(move || {
                let mut sel = Select::new();
                sel.recv(&r1);
                let o2 = sel.recv(&r2);
                let oper = sel.select();
                assert_eq!(oper.index(), o2);
                oper.recv(&r2).unwrap();
            });
            sleep(ms(50));
            drop(s1.clone());
            s2.send(()).unwrap();
        });
    }

    fn preflight() {
        let (s, r) = unbounded();
        s.send(()).unwrap();
        let mut sel = Select::new();
        sel.recv(&r);
        assert_eq!(sel.select().recv(&r), Ok(()));

        let (s, r) = unbounded();
        drop(s.clone());
        s.send(()).unwrap();
        drop(s);
        let mut sel = Select::new();
        sel.recv(&r);
        assert_eq!(
            sel.select().recv(&r),
            Ok(()),
            "a buffered value comes before the disconnection"
        );
        assert_eq!(r.try_recv(), Err(TryRecvError::Disconnected));

        let (s, r) = unbounded();
        drop(s.clone());
        s.send(()).unwrap();
        drop(s);
        r.recv().unwrap();
        let mut sel = Select::new();
        sel.recv(&r);
        assert!(sel.select().recv(&r).is_err());
    }

    fn duplicate_operations() {
        let (s, r) = unbounded::<i32>();
        let hit = [Cell::new(false), Cell::new(false), Cell::new(false), Cell::new(false)];
        let mut rounds = 0;
        while hit.iter().any(|h| !h.get()) {
            rounds += 1;
            assert!(rounds < 10_000, "some duplicate operation is never chosen: {hit:?}");
            let mut sel = Select::new();
            let o0 = sel.recv(&r);
            let o1 = sel.recv(&r);
            let o2 = sel.send(&s);
            let o3 = sel.send(&s);
            let oper = sel.select();
            match oper.index() {
                i if i == o0 => {
                    assert!(oper.recv(&r).is_ok());
                    hit[0].set(true);
                }
                i if i == o1 => {
                    assert!(oper.recv(&r).is_ok());
                    hit[1].set(true);
                }
                i if i == o2 => {
                    assert!(oper.send(&s, 0).is_ok());
                    hit[2].set(true);
                }
                i if i == o3 => {
                    assert!(oper.send(&s, 0).is_ok());
                    hit[3].set(true);
                }
                _ => unreachable!(),
            }
        }
    }

    fn nesting() {
        let (s, r) = unbounded::<i32>();
        let mut sel = Select::new();
        sel.send(&s);
        let oper = sel.select();
        assert!(oper.send(&s, 0).is_ok());
        let mut sel = Select::new();
        sel.recv(&r);
        let oper = sel.select();
        assert_eq!(oper.recv(&r), Ok(0));
        let mut sel = Select::new();
        sel.send(&s);
        let oper = sel.select();
        assert!(oper.send(&s, 1).is_ok());
        let mut sel = Select::new();
        sel.recv(&r);
        assert_eq!(sel.select().recv(&r), Ok(1));
    }

    fn stress_recv() {
        const COUNT: usize = 2_000;
        let (s1, r1) = unbounded();
        let (s2, r2) = bounded(5);
        let (s3, r3) = bounded(100);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    s1.send(i).unwrap();
                    r3.recv().unwrap();
                    s2.send(i).unwrap();
                    r3.recv().unwrap();
                }
            });
            for i in 0..COUNT {
                for _ in 0..2 {
                    let mut sel = Select::new();
                    let o1 = sel.recv(&r1);
                    let o2 = sel.recv(&r2);
                    let oper = sel.select();
                    match oper.index() {
                        ix if ix == o1 => assert_eq!(oper.recv(&r1), Ok(i)),
                        ix if ix == o2 => assert_eq!(oper.recv(&r2), Ok(i)),
                        _ => unreachable!(),
                    }
                    s3.send(()).unwrap();
                }
            }
        });
    }

    fn stress_send() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded(0);
        let (s2, r2) = bounded(0);
        let (s3, r3) = bounded(100);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    assert_eq!(r1.recv().unwrap(), i);
                    assert_eq!(r2.recv().unwrap(), i);
                    r3.recv().unwrap();
                }
            });
            for i in 0..COUNT {
                for _ in 0..2 {
                    let mut sel = Select::new();
                    let o1 = sel.send(&s1);
                    let o2 = sel.send(&s2);
                    let oper = sel.select();
                    match oper.index() {
                        ix if ix == o1 => assert!(oper.send(&s1, i).is_ok()),
                        ix if ix == o2 => assert!(oper.send(&s2, i).is_ok()),
                        _ => unreachable!(),
                    }
                }
                s3.send(()).unwrap();
            }
        });
    }

    fn stress_mixed() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded(0);
        let (s2, r2) = bounded(0);
        let (s3, r3) = bounded(100);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    s1.send(i).unwrap();
                    assert_eq!(r2.recv().unwrap(), i);
                    r3.recv().unwrap();
                }
            });
            for i in 0..COUNT {
                for _ in 0..2 {
                    let mut sel = Select::new();
                    let o1 = sel.recv(&r1);
                    let o2 = sel.send(&s2);
                    let oper = sel.select();
                    match oper.index() {
                        ix if ix == o1 => assert_eq!(oper.recv(&r1), Ok(i)),
                        ix if ix == o2 => assert!(oper.send(&s2, i).is_ok()),
                        _ => unreachable!(),
                    }
                }
                s3.send(()).unwrap();
            }
        });
    }

    fn stress_timeout_two_threads() {
        const COUNT: usize = 20;
        let (s, r) = bounded(2);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(30));
                    }
                    loop {
                        let mut sel = Select::new();
                        sel.send(&s);
                        if let Ok(oper) = sel.select_timeout(ms(5)) {
                            assert!(oper.send(&s, i).is_ok());
                            break;
                        };
                    }
                }
            });
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(30));
                    }
                    loop {
                        let mut sel = Select::new();
                        sel.recv(&r);
                        if let Ok(oper) = sel.select_timeout(ms(5)) {
                            assert_eq!(oper.recv(&r), Ok(i));
                            break;
                        };
                    }
                }
            });
        });
    }

    fn send_recv_same_channel() {
        // Rendezvous: a select never pairs its own send with its own
        // receive.
        let (s, r) = bounded::<i32>(0);
        let mut sel = Select::new();
        sel.send(&s);
        sel.recv(&r);
        assert!(sel.select_timeout(ms(50)).is_err());
        // Unbounded: the send is ready, the receive is not.
        let (s, r) = unbounded::<i32>();
        let mut sel = Select::new();
        let o1 = sel.send(&s);
        sel.recv(&r);
        let oper = sel.select_timeout(ms(50)).unwrap();
        assert_eq!(oper.index(), o1);
        assert!(oper.send(&s, 0).is_ok());
    }

    pub(super) fn matching_with(threads: usize, leftover: bool) {
        let (s, r) = &bounded::<usize>(0);
        scope(|sc| {
            for i in 0..threads {
                sc.spawn(move || {
                    let mut sel = Select::new();
                    let o1 = sel.recv(r);
                    let o2 = sel.send(s);
                    let oper = sel.select();
                    match oper.index() {
                        ix if ix == o1 => assert_ne!(oper.recv(r), Ok(i), "a select received its own value"),
                        ix if ix == o2 => assert!(oper.send(s, i).is_ok()),
                        _ => unreachable!(),
                    }
                });
            }
            if leftover {
                s.send(!0).unwrap();
            }
        });
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    }

    fn matching() {
        matching_with(44, false);
    }

    fn matching_with_leftover() {
        matching_with(55, true);
    }

    fn channel_through_channel() {
        const COUNT: usize = 200;
        type T = Box<dyn Any + Send>;
        for cap in 0..3 {
            let (s, r) = bounded::<T>(cap);
            scope(|sc| {
                sc.spawn(move || {
                    let mut s = s;
                    for _ in 0..COUNT {
                        let (new_s, new_r) = bounded(cap);
                        let new_r: T = Box::new(Some(new_r));
                        {
                            let mut sel = Select::new();
                            sel.send(&s);
                            assert!(sel.select().send(&s, new_r).is_ok());
                        }
                        s = new_s;
                    }
                });
                sc.spawn(move || {
                    let mut r = r;
                    for _ in 0..COUNT {
                        let new = {
                            let mut sel = Select::new();
                            sel.recv(&r);
                            sel.select()
                                .recv(&r)
                                .unwrap()
                                .downcast_mut::<Option<Receiver<T>>>()
                                .unwrap()
                                .take()
                                .unwrap()
                        };
                        r = new;
                    }
                });
            });
        }
    }

    fn fairness1() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded::<()>(COUNT);
        let (s2, r2) = unbounded::<()>();
        for _ in 0..COUNT {
            s1.send(()).unwrap();
            s2.send(()).unwrap();
        }
        let mut hits = [0usize; 4];
        for _ in 0..COUNT {
            let after = after(ms(0));
            let tick = tick(ms(0));
            let mut sel = Select::new();
            let o1 = sel.recv(&r1);
            let o2 = sel.recv(&r2);
            let o3 = sel.recv(&after);
            let o4 = sel.recv(&tick);
            let oper = sel.select();
            match oper.index() {
                i if i == o1 => {
                    oper.recv(&r1).unwrap();
                    hits[0] += 1;
                }
                i if i == o2 => {
                    oper.recv(&r2).unwrap();
                    hits[1] += 1;
                }
                i if i == o3 => {
                    oper.recv(&after).unwrap();
                    hits[2] += 1;
                }
                i if i == o4 => {
                    oper.recv(&tick).unwrap();
                    hits[3] += 1;
                }
                _ => unreachable!(),
            }
        }
        assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "{hits:?}");
    }

    fn fairness2() {
        const COUNT: usize = 2_000;
        let (s1, r1) = unbounded::<()>();
        let (s2, r2) = bounded::<()>(1);
        let (s3, r3) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(|| {
                for _ in 0..COUNT {
                    let mut sel = Select::new();
                    let mut o1 = None;
                    let mut o2 = None;
                    if s1.is_empty() {
                        o1 = Some(sel.send(&s1));
                    }
                    if s2.is_empty() {
                        o2 = Some(sel.send(&s2));
                    }
                    let o3 = sel.send(&s3);
                    let oper = sel.select();
                    match oper.index() {
                        i if Some(i) == o1 => assert!(oper.send(&s1, ()).is_ok()),
                        i if Some(i) == o2 => assert!(oper.send(&s2, ()).is_ok()),
                        i if i == o3 => assert!(oper.send(&s3, ()).is_ok()),
                        _ => unreachable!(),
                    }
                }
            });
            let mut hits = [0usize; 3];
            for _ in 0..COUNT {
                let mut sel = Select::new();
                let o1 = sel.recv(&r1);
                let o2 = sel.recv(&r2);
                let o3 = sel.recv(&r3);
                let oper = sel.select();
                match oper.index() {
                    i if i == o1 => {
                        oper.recv(&r1).unwrap();
                        hits[0] += 1;
                    }
                    i if i == o2 => {
                        oper.recv(&r2).unwrap();
                        hits[1] += 1;
                    }
                    i if i == o3 => {
                        oper.recv(&r3).unwrap();
                        hits[2] += 1;
                    }
                    _ => unreachable!(),
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 50), "{hits:?}");
        });
    }

    // Upstream shares one `Select` by reference (`sync_and_clone`) or moves
    // clones (`send_and_clone`) into 20 threads; fiber's `Select` is not
    // `Send`/`Sync` (documented). Each peer here clones a select it built,
    // and the clone keeps the operations and indices.
    fn clone_in_each_peer() {
        const THREADS: usize = 20;
        let (s, r) = &bounded::<usize>(0);
        scope(|sc| {
            for i in 0..THREADS {
                sc.spawn(move || {
                    let mut proto = Select::new();
                    let o1 = proto.recv(r);
                    let o2 = proto.send(s);
                    let mut sel = proto.clone();
                    drop(proto);
                    let oper = sel.select();
                    match oper.index() {
                        ix if ix == o1 => assert_ne!(oper.recv(r), Ok(i)),
                        ix if ix == o2 => assert!(oper.send(s, i).is_ok()),
                        _ => unreachable!(),
                    }
                });
            }
        });
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    }

    fn reuse() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded(0);
        let (s2, r2) = bounded(0);
        let (s3, r3) = bounded(100);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    s1.send(i).unwrap();
                    assert_eq!(r2.recv().unwrap(), i);
                    r3.recv().unwrap();
                }
            });
            let mut sel = Select::new();
            let o1 = sel.recv(&r1);
            let o2 = sel.send(&s2);
            for i in 0..COUNT {
                for _ in 0..2 {
                    let oper = sel.select();
                    match oper.index() {
                        ix if ix == o1 => assert_eq!(oper.recv(&r1), Ok(i)),
                        ix if ix == o2 => assert!(oper.send(&s2, i).is_ok()),
                        _ => unreachable!(),
                    }
                }
                s3.send(()).unwrap();
            }
        });
    }

    // crossbeam issue 1096: completing a selected operation through a
    // clone of the handle it was registered with.
    fn issue_1096() {
        let (tx, rx) = unbounded::<u32>();
        tx.send(123).unwrap();
        let mut sel = Select::new();
        sel.recv(&rx);
        assert_eq!(sel.select().recv(&rx.clone()).unwrap(), 123);

        let (tx, rx) = unbounded::<u32>();
        let mut sel = Select::new();
        sel.send(&tx);
        sel.select().send(&tx.clone(), 124).unwrap();
        assert_eq!(rx.recv().unwrap(), 124);

        let (tx, rx) = bounded::<u32>(2);
        tx.send(123).unwrap();
        let mut sel = Select::new();
        sel.recv(&rx);
        assert_eq!(sel.select().recv(&rx.clone()).unwrap(), 123);

        let (tx, rx) = bounded::<u32>(2);
        let mut sel = Select::new();
        sel.send(&tx);
        sel.select().send(&tx.clone(), 124).unwrap();
        assert_eq!(rx.recv().unwrap(), 124);

        let (tx, rx) = bounded::<u32>(0);
        scope(|sc| {
            sc.spawn(|| tx.send(123).unwrap());
            let mut sel = Select::new();
            sel.recv(&rx);
            assert_eq!(sel.select().recv(&rx.clone()).unwrap(), 123);
        });

        let (tx, rx) = bounded::<u32>(0);
        scope(|sc| {
            sc.spawn(|| assert_eq!(rx.recv().unwrap(), 124));
            let mut sel = Select::new();
            sel.send(&tx);
            sel.select().send(&tx.clone(), 124).unwrap();
        });
    }

    // Upstream `uncompleted_select_zero`: dropping a selected send (which
    // reserved a parked receiver) without completing it panics with
    // crossbeam's message. Upstream's receiver then hangs (a TODO there);
    // fiber gives the reservation back, so the receiver gets a later value.
    fn uncompleted_select_zero() {
        let (s, r) = bounded::<Box<u8>>(0);
        let receiver = go(move || r.recv().map(|b| *b));
        while s.waiting().0 == 0 {
            sleep(ms(1));
        }
        let res = catch_unwind(AssertUnwindSafe(|| {
            let mut sel = Select::new();
            sel.send(&s);
            drop(sel.try_select().unwrap());
        }));
        assert_eq!(
            panic_text(&*res.unwrap_err()),
            "dropped `SelectedOperation` without completing the operation"
        );
        s.send(Box::new(9)).unwrap();
        assert_eq!(receiver.join(), Ok(9));
    }

    // Upstream `uncompleted_select_{unbounded,bounded}` (their TODO: should
    // panic instead of hang): a selected send dropped uncompleted panics,
    // and the channel keeps its capacity.
    fn uncompleted_select_buffered() {
        for (cap, prefill) in [(None, 0), (None, 1), (Some(2), 0), (Some(2), 1)] {
            let (s, r) = match cap {
                Some(c) => bounded::<Box<u8>>(c),
                None => unbounded(),
            };
            for i in 0..prefill {
                s.send(Box::new(i)).unwrap();
            }
            let res = catch_unwind(AssertUnwindSafe(|| {
                let mut sel = Select::new();
                sel.send(&s);
                drop(sel.try_select().unwrap());
            }));
            assert_eq!(
                panic_text(&*res.unwrap_err()),
                "dropped `SelectedOperation` without completing the operation"
            );
            if let Some(c) = cap {
                for i in prefill..c as u8 {
                    s.try_send(Box::new(i)).expect("the given-back slot is free again");
                }
                assert!(s.try_send(Box::new(99)).is_err());
            }
            assert_eq!(*r.try_recv().unwrap_or(Box::new(0)), 0);
        }
    }

    // Upstream `forget_select_*`: a selected operation that is leaked
    // (`mem::forget`) must not make dropping the channel hang or crash.
    fn forget_select() {
        for cap in [Some(0), Some(2), None] {
            let (s, r) = match cap {
                Some(c) => bounded::<Box<u8>>(c),
                None => unbounded(),
            };
            let s2 = s.clone();
            let receiver = if cap == Some(0) {
                let r2 = r.clone();
                Some(go(move || {
                    let _ = r2.recv_timeout(ms(100));
                }))
            } else {
                None
            };
            let th = go(move || {
                let mut sel = Select::new();
                sel.send(&s2);
                if let Ok(oper) = sel.select_timeout(ms(100)) {
                    std::mem::forget(oper);
                };
            });
            th.join();
            if let Some(h) = receiver {
                h.join();
            }
            drop(s);
            drop(r);
        }
    }

    port!(
        smoke1,
        smoke2,
        disconnected,
        default,
        timeout,
        default_when_disconnected,
        default_only,
        unblocks,
        both_ready,
        loop_try,
        cloning1,
        cloning2,
        preflight,
        duplicate_operations,
        nesting,
        stress_recv,
        stress_send,
        stress_mixed,
        stress_timeout_two_threads,
        send_recv_same_channel,
        matching,
        matching_with_leftover,
        channel_through_channel,
        fairness1,
        fairness2,
        clone_in_each_peer,
        reuse,
        issue_1096,
        uncompleted_select_zero,
        uncompleted_select_buffered,
        forget_select,
    );
}

// ---------------------------------------------------------------------------
// ready.rs: `Select::ready` and friends.

mod ready {
    use super::*;

    fn smoke() {
        let (s1, r1) = unbounded::<usize>();
        let (s2, r2) = unbounded::<usize>();
        s1.send(1).unwrap();
        let mut sel = Select::new();
        sel.recv(&r1);
        sel.recv(&r2);
        assert_eq!(sel.ready(), 0);
        assert_eq!(r1.try_recv(), Ok(1));
        s2.send(2).unwrap();
        let mut sel = Select::new();
        sel.recv(&r1);
        sel.recv(&r2);
        assert_eq!(sel.ready(), 1);
        assert_eq!(r2.try_recv(), Ok(2));
    }

    fn disconnected_and_timeout() {
        let (s1, r1) = unbounded::<i32>();
        let (s2, r2) = unbounded::<i32>();
        let mut sel = Select::new();
        sel.recv(&r1);
        sel.recv(&r2);
        assert!(sel.try_ready().is_err());
        assert!(sel.ready_timeout(ms(50)).is_err());
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(50));
                drop(s1);
            });
            let mut sel = Select::new();
            sel.recv(&r1);
            sel.recv(&r2);
            assert_eq!(sel.ready_timeout(ms(2000)), Ok(0));
            assert_eq!(r1.try_recv(), Err(TryRecvError::Disconnected));
        });
        drop(s2);
        let mut sel = Select::new();
        sel.recv(&r2);
        assert_eq!(sel.try_ready(), Ok(0));
        // A send to a channel without receivers is ready (it fails at once).
        let (s, _) = bounded::<i32>(0);
        let mut sel = Select::new();
        sel.send(&s);
        assert_eq!(sel.try_ready(), Ok(0));
        assert_eq!(s.try_send(0), Err(TrySendError::Disconnected(0)));
        // Nothing to wait for.
        let mut sel = Select::new();
        assert!(sel.try_ready().is_err());
        let start = Instant::now();
        assert!(sel.ready_timeout(ms(50)).is_err());
        assert!(start.elapsed() >= ms(50));
    }

    fn unblocks_and_both_ready() {
        let (s1, r1) = bounded(0);
        let (s2, r2) = bounded(0);
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(50));
                s2.send(2).unwrap();
            });
            let mut sel = Select::new();
            sel.recv(&r1);
            sel.recv(&r2);
            assert_eq!(sel.ready_timeout(ms(2000)), Ok(1));
            assert_eq!(
                r2.try_recv(),
                Ok(2),
                "ready on a parked rendezvous sender; try_recv takes its value"
            );
        });
        scope(|sc| {
            sc.spawn(|| {
                sleep(ms(50));
                s1.send(1).unwrap();
                assert_eq!(r2.recv().unwrap(), 2);
            });
            for _ in 0..2 {
                let mut sel = Select::new();
                sel.recv(&r1);
                sel.send(&s2);
                match sel.ready() {
                    0 => assert_eq!(r1.try_recv(), Ok(1)),
                    1 => s2.try_send(2).unwrap(),
                    _ => unreachable!(),
                }
            }
        });
    }

    fn send_recv_same_channel() {
        let (s, r) = bounded::<i32>(0);
        let mut sel = Select::new();
        sel.send(&s);
        sel.recv(&r);
        assert!(
            sel.ready_timeout(ms(50)).is_err(),
            "a select is not its own rendezvous partner"
        );
        let (s, r) = unbounded::<i32>();
        let mut sel = Select::new();
        sel.send(&s);
        sel.recv(&r);
        assert_eq!(sel.ready_timeout(ms(50)), Ok(0));
        assert!(s.try_send(0).is_ok());
    }

    fn stress_recv() {
        const COUNT: usize = 2_000;
        let (s1, r1) = unbounded();
        let (s2, r2) = bounded(5);
        let (s3, r3) = bounded(0);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    s1.send(i).unwrap();
                    r3.recv().unwrap();
                    s2.send(i).unwrap();
                    r3.recv().unwrap();
                }
            });
            for i in 0..COUNT {
                for _ in 0..2 {
                    let mut sel = Select::new();
                    sel.recv(&r1);
                    sel.recv(&r2);
                    match sel.ready() {
                        0 => assert_eq!(r1.try_recv(), Ok(i)),
                        1 => assert_eq!(r2.try_recv(), Ok(i)),
                        _ => unreachable!(),
                    }
                    s3.send(()).unwrap();
                }
            }
        });
    }

    fn stress_mixed() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded(0);
        let (s2, r2) = bounded(0);
        let (s3, r3) = bounded(100);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    s1.send(i).unwrap();
                    assert_eq!(r2.recv().unwrap(), i);
                    r3.recv().unwrap();
                }
            });
            for i in 0..COUNT {
                for _ in 0..2 {
                    let mut sel = Select::new();
                    sel.recv(&r1);
                    sel.send(&s2);
                    match sel.ready() {
                        0 => assert_eq!(r1.try_recv(), Ok(i)),
                        1 => s2.try_send(i).unwrap(),
                        _ => unreachable!(),
                    }
                }
                s3.send(()).unwrap();
            }
        });
    }

    fn stress_timeout_two_threads() {
        const COUNT: usize = 20;
        let (s, r) = bounded(2);
        scope(|sc| {
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(30));
                    }
                    loop {
                        let mut sel = Select::new();
                        sel.send(&s);
                        if let Ok(0) = sel.ready_timeout(ms(5)) {
                            assert!(s.try_send(i).is_ok());
                            break;
                        }
                    }
                }
            });
            sc.spawn(|| {
                for i in 0..COUNT {
                    if i % 2 == 0 {
                        sleep(ms(30));
                    }
                    loop {
                        let mut sel = Select::new();
                        sel.recv(&r);
                        if let Ok(0) = sel.ready_timeout(ms(5)) {
                            assert_eq!(r.try_recv(), Ok(i));
                            break;
                        }
                    }
                }
            });
        });
    }

    fn fairness1() {
        const COUNT: usize = 2_000;
        let (s1, r1) = bounded::<()>(COUNT);
        let (s2, r2) = unbounded::<()>();
        for _ in 0..COUNT {
            s1.send(()).unwrap();
            s2.send(()).unwrap();
        }
        let mut hits = [0usize; 4];
        for _ in 0..COUNT {
            let after = after(ms(0));
            let tick = tick(ms(0));
            let mut sel = Select::new();
            sel.recv(&r1);
            sel.recv(&r2);
            sel.recv(&after);
            sel.recv(&tick);
            let i = sel.ready();
            hits[i] += 1;
            match i {
                0 => r1.try_recv().unwrap(),
                1 => r2.try_recv().unwrap(),
                2 => drop(after.try_recv().unwrap()),
                _ => drop(tick.try_recv().unwrap()),
            }
        }
        assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "{hits:?}");
    }

    fn fairness2() {
        const COUNT: usize = 2_000;
        let (s1, r1) = unbounded::<()>();
        let (s2, r2) = bounded::<()>(1);
        let (s3, r3) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(|| {
                for _ in 0..COUNT {
                    let mut sel = Select::new();
                    let mut o1 = None;
                    let mut o2 = None;
                    if s1.is_empty() {
                        o1 = Some(sel.send(&s1));
                    }
                    if s2.is_empty() {
                        o2 = Some(sel.send(&s2));
                    }
                    let o3 = sel.send(&s3);
                    let oper = sel.select();
                    match oper.index() {
                        i if Some(i) == o1 => assert!(oper.send(&s1, ()).is_ok()),
                        i if Some(i) == o2 => assert!(oper.send(&s2, ()).is_ok()),
                        i if i == o3 => assert!(oper.send(&s3, ()).is_ok()),
                        _ => unreachable!(),
                    }
                }
            });
            let mut hits = [0usize; 3];
            for _ in 0..COUNT {
                let mut sel = Select::new();
                sel.recv(&r1);
                sel.recv(&r2);
                sel.recv(&r3);
                loop {
                    let i = sel.ready();
                    let got = match i {
                        0 => r1.try_recv().is_ok(),
                        1 => r2.try_recv().is_ok(),
                        _ => r3.try_recv().is_ok(),
                    };
                    if got {
                        hits[i] += 1;
                        break;
                    }
                }
            }
            assert!(hits.iter().all(|x| *x > 0), "{hits:?}");
        });
    }

    port!(
        smoke,
        disconnected_and_timeout,
        unblocks_and_both_ready,
        send_recv_same_channel,
        stress_recv,
        stress_mixed,
        stress_timeout_two_threads,
        fairness1,
        fairness2,
    );
}

// ---------------------------------------------------------------------------
// select_macro.rs: what the `Select` ports above do not already cover.

mod select_macro {
    use super::*;

    fn panic_sender() {
        fn get() -> Sender<i32> {
            panic!("send panicked")
        }
        let res = catch_unwind(|| {
            select! {
                send(get(), panic!("the value is evaluated after the operand")) -> _ => {}
            }
        });
        assert_eq!(panic_text(&*res.unwrap_err()), "send panicked");
    }

    fn panic_receiver() {
        fn get() -> Receiver<i32> {
            panic!("recv panicked")
        }
        let res = catch_unwind(|| {
            select! {
                recv(get()) -> _ => {}
            }
        });
        assert_eq!(panic_text(&*res.unwrap_err()), "recv panicked");
    }

    // A panic in an arm's body unwinds out of the select and leaves the
    // channels usable (no reservation left behind).
    fn panic_in_arm_body() {
        let (s, r) = bounded::<i32>(1);
        let res = catch_unwind(AssertUnwindSafe(|| {
            select! {
                send(s, 1) -> _ => panic!("body"),
            }
        }));
        assert_eq!(panic_text(&*res.unwrap_err()), "body");
        assert_eq!(r.try_recv(), Ok(1), "the send completed before the body ran");
        s.send(2).unwrap();
        let res = catch_unwind(AssertUnwindSafe(|| {
            select! {
                recv(r) -> v => panic!("got {v:?}"),
            }
        }));
        assert_eq!(panic_text(&*res.unwrap_err()), "got Ok(2)");
        s.try_send(3).unwrap();
        assert_eq!(r.try_recv(), Ok(3));
    }

    fn fairness_recv() {
        const COUNT: usize = 5_000;
        let (s1, r1) = bounded::<()>(COUNT);
        let (s2, r2) = unbounded::<()>();
        for _ in 0..COUNT {
            s1.send(()).unwrap();
            s2.send(()).unwrap();
        }
        let mut hits = [0usize; 2];
        while hits[0] + hits[1] < COUNT {
            select! {
                recv(r1) -> _ => hits[0] += 1,
                recv(r2) -> _ => hits[1] += 1,
            }
        }
        assert!(hits.iter().all(|x| *x >= COUNT / 4), "{hits:?}");
    }

    fn fairness_send() {
        const COUNT: usize = 5_000;
        let (s1, _r1) = bounded::<()>(COUNT);
        let (s2, _r2) = unbounded::<()>();
        let mut hits = [0usize; 2];
        for _ in 0..COUNT {
            select! {
                send(s1, ()) -> _ => hits[0] += 1,
                send(s2, ()) -> _ => hits[1] += 1,
            }
        }
        assert!(hits.iter().all(|x| *x >= COUNT / 4), "{hits:?}");
    }

    fn unfairness() {
        const COUNT: usize = 2_000;
        for variant in 0..3 {
            let (s1, r1) = unbounded::<()>();
            let (s2, r2) = unbounded::<()>();
            let (s3, r3) = unbounded::<()>();
            for _ in 0..COUNT {
                s1.send(()).unwrap();
                s2.send(()).unwrap();
            }
            s3.send(()).unwrap();
            let mut hits = [0usize; 3];
            for round in 1..=2 {
                for _ in 0..COUNT {
                    match variant {
                        0 => select_biased! {
                            recv(r1) -> _ => hits[0] += 1,
                            recv(r2) -> _ => hits[1] += 1,
                            recv(r3) -> _ => hits[2] += 1,
                        },
                        1 => select_biased! {
                            recv(r1) -> _ => hits[0] += 1,
                            recv(r2) -> _ => hits[1] += 1,
                            recv(r3) -> _ => hits[2] += 1,
                            default(ms(1000)) => unreachable!(),
                        },
                        _ => select_biased! {
                            recv(r1) -> _ => hits[0] += 1,
                            recv(r2) -> _ => hits[1] += 1,
                            recv(r3) -> _ => hits[2] += 1,
                            default() => unreachable!(),
                        },
                    }
                }
                let want = if round == 1 { [COUNT, 0, 0] } else { [COUNT, COUNT, 0] };
                assert_eq!(hits, want, "variant {variant}");
            }
        }
    }

    fn references_and_operand_forms() {
        let (s, r) = unbounded::<i32>();
        select! {
            send(s, 0) -> _ => {}
            recv(r) -> _ => {}
        }
        select! {
            send(&&&&s, 0) -> _ => {}
            recv(&&&&r) -> _ => {}
        }
        select! {
            recv(Some(&r).unwrap_or(&never())) -> _ => {},
            default => {}
        }
        let boxed = (Box::new(s.clone()), Box::new(r.clone()));
        select! {
            send(*boxed.0, 0) -> _ => {}
            recv(*boxed.1) -> _ => {}
            default => {}
        }
        select! {
            recv(Some(r).unwrap_or(never())) -> _ => {},
            default => {}
        }
        let (s, r) = unbounded::<i32>();
        select! {
            recv((move || r)()) -> _ => {}
            send((move || s)(), 0) -> _ => {}
        }
    }

    // Every operand, body and value is evaluated at most once, and a value
    // moved into an arm is moved only in the arm that runs.
    fn once_blocks_and_operands() {
        let (s, r) = unbounded::<i32>();
        let once = Box::new(());
        select! { send(s, 0) -> _ => drop(once) }
        let once = Box::new(());
        select! { recv(r) -> _ => drop(once) }
        let (once1, once2) = (Box::new(()), Box::new(()));
        select! {
            send(s, 0) -> _ => drop(once1),
            default => drop(once2),
        }
        let (once1, once2) = (Box::new(()), Box::new(()));
        select! {
            recv(r) -> _ => drop(once1),
            default => drop(once2),
        }
        let (once1, once2) = (Box::new(()), Box::new(()));
        select! {
            recv(r) -> _ => drop(once1),
            send(s, 0) -> _ => drop(once2),
        }
        let calls = Cell::new(0);
        let (_, r) = unbounded::<i32>();
        let get = || {
            calls.set(calls.get() + 1);
            &r
        };
        select! { recv(get()) -> v => assert!(v.is_err()) }
        let (s, _) = unbounded::<i32>();
        let gets = || {
            calls.set(calls.get() + 1);
            &s
        };
        select! { send(gets(), 5) -> v => assert!(v.is_err()) }
        assert_eq!(calls.get(), 2);
    }

    fn evaluate_and_result_types() {
        let (s, r) = unbounded::<i32>();
        let v: String = select! {
            recv(r) -> _ => "foo".into(),
            send(s, 0) -> _ => "bar".to_owned(),
            default => "baz".to_string(),
        };
        assert_eq!(v, "bar");
        let v: String = select! {
            recv(r) -> _ => "foo".into(),
            default => "baz".to_string(),
        };
        assert_eq!(v, "foo");
        let v: String = select! {
            recv(r) -> _ => "foo".into(),
            default => "baz".to_string(),
        };
        assert_eq!(v, "baz");

        let (s, _) = bounded::<i32>(0);
        let (_, r) = bounded::<i32>(0);
        select! { recv(r) -> res => { let _: Result<i32, RecvError> = res; } }
        select! { send(s, 0) -> res => { let _: Result<(), SendError<i32>> = res; } }
        select! {
            send(s, 0) -> res => { let _: Result<(), SendError<i32>> = res; },
            recv(r) -> res => { let _: Result<i32, RecvError> = res; },
        }
        let (_, r) = unbounded::<i32>();
        select! { recv(r) -> r => assert!(r.is_err()) }
    }

    // select_macro.rs `try_recv` ... `disconnect_wakes_receiver`: the
    // channel operations written as one-arm selects.
    fn one_arm_ops() {
        let (s, r) = bounded::<i32>(0);
        scope(|sc| {
            sc.spawn(move || {
                select! { recv(r) -> _ => panic!(), default => {} }
                sleep(ms(300));
                select! { recv(r) -> v => assert_eq!(v, Ok(7)), default => panic!("a parked sender was not seen") }
                sleep(ms(100));
                select! { recv(r) -> v => assert_eq!(v, Err(RecvError)), default => panic!() }
            });
            sc.spawn(move || {
                sleep(ms(150));
                select! { send(s, 7) -> res => res.unwrap() }
            });
        });
        let (s, r) = bounded::<i32>(0);
        scope(|sc| {
            sc.spawn(move || {
                select! { recv(r) -> _ => panic!(), default(ms(100)) => {} }
                select! { recv(r) -> v => assert_eq!(v, Ok(7)), default(ms(2000)) => panic!() }
                select! { recv(r) -> v => assert_eq!(v, Err(RecvError)), default(ms(2000)) => panic!() }
            });
            sc.spawn(move || {
                sleep(ms(250));
                select! { send(s, 7) -> res => res.unwrap() }
            });
        });
        let (s, r) = bounded::<i32>(0);
        scope(|sc| {
            sc.spawn(move || {
                select! { send(s, 7) -> _ => panic!(), default => {} }
                sleep(ms(300));
                select! { send(s, 8) -> res => res.unwrap(), default => panic!("a parked receiver was not seen") }
                sleep(ms(100));
                select! { send(s, 9) -> res => assert_eq!(res, Err(SendError(9))), default => panic!() }
            });
            sc.spawn(move || {
                sleep(ms(150));
                select! { recv(r) -> v => assert_eq!(v, Ok(8)) }
            });
        });
        let (s, r) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(move || select! { send(s, ()) -> res => assert_eq!(res, Err(SendError(()))) });
            sc.spawn(move || {
                sleep(ms(50));
                drop(r);
            });
        });
        let (s, r) = bounded::<()>(0);
        scope(|sc| {
            sc.spawn(move || select! { recv(r) -> v => assert_eq!(v, Err(RecvError)) });
            sc.spawn(move || {
                sleep(ms(50));
                drop(s);
            });
        });
    }

    fn default_syntax_and_trailing_commas() {
        let (s, r) = bounded::<i32>(0);
        select! { recv(r) -> _ => panic!(), default => {} }
        select! { send(s, 0) -> _ => panic!(), default() => {} }
        select! { default => {} }
        select! { default() => {} }
        select! { recv(r,) -> _ => panic!(), default(ms(0),) => {}, }
        select! { send(s, 0,) -> _ => panic!(), default(ms(0)) => {}, }
    }

    port!(
        panic_sender,
        panic_receiver,
        panic_in_arm_body,
        fairness_recv,
        fairness_send,
        unfairness,
        references_and_operand_forms,
        once_blocks_and_operands,
        evaluate_and_result_types,
        one_arm_ops,
        default_syntax_and_trailing_commas,
    );
}

// ---------------------------------------------------------------------------
// after.rs, tick.rs, never.rs: timer channels. Lower time bounds as
// upstream; upper bounds loosened for a shared machine.

mod timers {
    use super::*;

    fn after_fire() {
        let start = Instant::now();
        let r = after(ms(50));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
        sleep(ms(100));
        let fired = r.try_recv().unwrap();
        assert!(start < fired);
        assert!(fired - start >= ms(50));
        let now = Instant::now();
        assert!(fired < now);
        assert!(now - fired >= ms(50), "delivers its due instant, not the receive's");
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
        select! { recv(r) -> _ => panic!(), default => {} }
        select! {
            recv(r) -> _ => panic!("an after channel fires once"),
            recv(after(ms(100))) -> _ => {}
        }
    }

    fn after_capacity_len() {
        for i in 0..10 {
            assert_eq!(after(ms(i)).capacity(), Some(1));
            assert_eq!(tick(ms(i + 1)).capacity(), Some(1));
        }
        for (name, make) in [("after", after as fn(Duration) -> Receiver<Instant>), ("tick", tick)] {
            let r = make(ms(50));
            assert_eq!((r.len(), r.is_empty(), r.is_full()), (0, true, false), "{name}");
            sleep(ms(100));
            assert_eq!((r.len(), r.is_empty(), r.is_full()), (1, false, true), "{name}");
            r.try_recv().unwrap();
            assert_eq!(
                (r.len(), r.is_empty(), r.is_full()),
                (0, true, false),
                "{name} after its receive"
            );
        }
    }

    fn after_try_recv() {
        let r = after(ms(200));
        assert!(r.try_recv().is_err());
        sleep(ms(100));
        assert!(r.try_recv().is_err());
        sleep(ms(200));
        assert!(r.try_recv().is_ok());
        assert!(r.try_recv().is_err());
        sleep(ms(200));
        assert!(r.try_recv().is_err());
    }

    fn after_recv_and_timeout() {
        let start = Instant::now();
        let r = after(ms(50));
        let fired = r.recv().unwrap();
        assert!(start < fired && fired - start >= ms(50));
        assert!(fired < Instant::now());
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));

        let start = Instant::now();
        let r = after(ms(200));
        assert_eq!(r.recv_timeout(ms(100)), Err(RecvTimeoutError::Timeout));
        assert!(start.elapsed() >= ms(100));
        let fired = r.recv_timeout(ms(200)).unwrap();
        assert!(fired - start >= ms(200));
        assert!(fired - start <= ms(600));
        assert_eq!(
            r.recv_timeout(ms(100)),
            Err(RecvTimeoutError::Timeout),
            "never disconnects"
        );
        assert!(start.elapsed() >= ms(300));
    }

    fn after_recv_two() {
        let r1 = after(ms(50));
        let r2 = after(ms(50));
        scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    select! {
                        recv(r1) -> v => assert!(v.is_ok()),
                        recv(r2) -> v => assert!(v.is_ok()),
                    }
                });
            }
        });
        // Each fired once: both are empty now.
        assert!(r1.try_recv().is_err() && r2.try_recv().is_err());
    }

    fn recv_race() {
        select! {
            recv(after(ms(50))) -> _ => {}
            recv(after(ms(200))) -> _ => panic!(),
        }
        select! {
            recv(after(ms(200))) -> _ => panic!(),
            recv(after(ms(50))) -> _ => {}
        }
        select! {
            recv(tick(ms(50))) -> _ => {}
            recv(tick(ms(200))) -> _ => panic!(),
        }
        select! {
            recv(tick(ms(200))) -> _ => panic!(),
            recv(tick(ms(50))) -> _ => {}
        }
    }

    fn stress_default() {
        for _ in 0..10 {
            select! { recv(after(ms(0))) -> _ => {}, default => panic!("a due timer is ready") }
            select! { recv(tick(ms(0))) -> _ => {}, default => panic!("a due tick is ready") }
        }
        for _ in 0..10 {
            select! { recv(after(ms(100))) -> _ => panic!(), default => {} }
            select! { recv(tick(ms(100))) -> _ => panic!(), default => {} }
        }
    }

    // Many `after` channels selected at once (over 8 operations, so past
    // the select's inline storage), by 4 peers: each fires exactly once.
    fn after_select_many() {
        const THREADS: usize = 4;
        const COUNT: usize = 200;
        let v = (0..COUNT).map(|i| after(ms(i as u64 / 4))).collect::<Vec<_>>();
        let hits = AtomicUsize::new(0);
        scope(|sc| {
            for _ in 0..THREADS {
                sc.spawn(|| loop {
                    let timeout = after(ms(200));
                    let mut sel = Select::new();
                    for r in &v {
                        sel.recv(r);
                    }
                    let ot = sel.recv(&timeout);
                    let oper = sel.select();
                    match oper.index() {
                        i if i == ot => {
                            oper.recv(&timeout).unwrap();
                            break;
                        }
                        i => {
                            oper.recv(&v[i]).unwrap();
                            hits.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        assert_eq!(hits.load(Ordering::SeqCst), COUNT);
    }

    fn after_ready_many() {
        const THREADS: usize = 4;
        const COUNT: usize = 200;
        let v = (0..COUNT).map(|i| after(ms(i as u64 / 4))).collect::<Vec<_>>();
        let hits = AtomicUsize::new(0);
        scope(|sc| {
            for _ in 0..THREADS {
                sc.spawn(|| loop {
                    let timeout = after(ms(200));
                    let mut sel = Select::new();
                    for r in &v {
                        sel.recv(r);
                    }
                    let ot = sel.recv(&timeout);
                    loop {
                        let i = sel.ready();
                        if i == ot {
                            timeout.try_recv().unwrap();
                            return;
                        } else if v[i].try_recv().is_ok() {
                            hits.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                    }
                });
            }
        });
        assert_eq!(hits.load(Ordering::SeqCst), COUNT);
    }

    fn after_stress_clone() {
        for i in 0..30 {
            let r = after(ms(i));
            scope(|sc| {
                for _ in 0..4 {
                    sc.spawn(|| {
                        let r = r.clone();
                        let _ = r.try_recv();
                        for _ in 0..20 {
                            drop(r.clone());
                            relax();
                        }
                    });
                }
            });
        }
    }

    fn after_fairness() {
        const COUNT: usize = 1000;
        for dur in [0, 1] {
            let mut hits = [0usize; 2];
            for _ in 0..COUNT {
                select! {
                    recv(after(ms(dur))) -> _ => hits[0] += 1,
                    recv(after(ms(dur))) -> _ => hits[1] += 1,
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "{dur}: {hits:?}");
            let mut hits = [0usize; 5];
            for _ in 0..COUNT {
                let r = after(ms(dur));
                select! {
                    recv(r) -> _ => hits[0] += 1,
                    recv(r) -> _ => hits[1] += 1,
                    recv(r) -> _ => hits[2] += 1,
                    recv(r) -> _ => hits[3] += 1,
                    recv(r) -> _ => hits[4] += 1,
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "{dur}: {hits:?}");
        }
    }

    fn tick_fire() {
        let start = Instant::now();
        let r = tick(ms(50));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
        sleep(ms(100));
        let fired = r.try_recv().unwrap();
        assert!(start < fired && fired - start >= ms(50));
        let now = Instant::now();
        assert!(fired < now && now - fired >= ms(50));
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty), "missed ticks do not pile up");
        select! { recv(r) -> _ => panic!(), default => {} }
        select! {
            recv(r) -> _ => {}
            recv(tick(ms(200))) -> _ => panic!(),
        }
    }

    fn tick_intervals() {
        let start = Instant::now();
        let r = tick(ms(50));
        let t1 = r.recv().unwrap();
        assert!(start + ms(50) <= t1);
        assert!(start + ms(100) > t1);
        sleep(ms(300));
        let t2 = r.try_recv().unwrap();
        assert!(start + ms(100) <= t2, "the next due instant after t1");
        assert!(start + ms(150) > t2, "t2 = t1 + period: {:?}", t2 - start);
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
        let t3 = r.recv().unwrap();
        let late = t2.max(start + ms(350));
        assert!(
            late + ms(50) <= t3 || start + ms(400) <= t3,
            "restarts one period after the late receive"
        );
        assert_eq!(r.try_recv(), Err(TryRecvError::Empty));
    }

    fn tick_try_recv() {
        let r = tick(ms(200));
        assert!(r.try_recv().is_err());
        sleep(ms(100));
        assert!(r.try_recv().is_err());
        sleep(ms(200));
        assert!(r.try_recv().is_ok());
        assert!(r.try_recv().is_err());
        sleep(ms(200));
        assert!(r.try_recv().is_ok());
        assert!(r.try_recv().is_err());
    }

    fn tick_recv_timeout() {
        let start = Instant::now();
        let r = tick(ms(200));
        assert!(r.recv_timeout(ms(100)).is_err());
        assert!(start.elapsed() >= ms(100));
        let fired = r.recv_timeout(ms(200)).unwrap();
        assert!(fired - start >= ms(200));
        assert!(r.recv_timeout(ms(100)).is_err());
        assert!(start.elapsed() >= ms(300));
        let fired2 = r.recv_timeout(ms(200)).unwrap();
        assert!(fired2 - start >= ms(400));
        assert_eq!(fired2 - fired, ms(200), "a waiting receive keeps the schedule");
    }

    fn tick_recv_two() {
        let r1 = tick(ms(20));
        let r2 = tick(ms(20));
        scope(|sc| {
            for _ in 0..2 {
                sc.spawn(|| {
                    for _ in 0..10 {
                        select! {
                            recv(r1) -> v => assert!(v.is_ok()),
                            recv(r2) -> v => assert!(v.is_ok()),
                        }
                    }
                });
            }
        });
    }

    fn tick_select_and_ready() {
        const THREADS: usize = 4;
        for use_ready in [false, true] {
            let hits = AtomicUsize::new(0);
            let r1 = tick(ms(200));
            let r2 = tick(ms(300));
            scope(|sc| {
                for _ in 0..THREADS {
                    sc.spawn(|| {
                        let timeout = after(ms(1100));
                        'outer: loop {
                            let mut sel = Select::new();
                            sel.recv(&r1);
                            sel.recv(&r2);
                            sel.recv(&timeout);
                            if use_ready {
                                loop {
                                    match sel.ready() {
                                        0 if r1.try_recv().is_ok() => break,
                                        1 if r2.try_recv().is_ok() => break,
                                        2 if timeout.try_recv().is_ok() => break 'outer,
                                        _ => {}
                                    }
                                }
                            } else {
                                let oper = sel.select();
                                match oper.index() {
                                    0 => drop(oper.recv(&r1).unwrap()),
                                    1 => drop(oper.recv(&r2).unwrap()),
                                    _ => {
                                        oper.recv(&timeout).unwrap();
                                        break;
                                    }
                                }
                            }
                            hits.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                }
            });
            // 200, 400, 600, 800, 1000 and 300, 600, 900 ms.
            assert_eq!(hits.load(Ordering::SeqCst), 8, "use_ready = {use_ready}");
        }
    }

    fn tick_fairness() {
        const COUNT: usize = 30;
        for dur in [0, 1] {
            let mut hits = [0usize; 2];
            for _ in 0..COUNT {
                let r1 = tick(ms(dur));
                let r2 = tick(ms(dur));
                for _ in 0..COUNT {
                    select! {
                        recv(r1) -> _ => hits[0] += 1,
                        recv(r2) -> _ => hits[1] += 1,
                    }
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "{dur}: {hits:?}");
            let mut hits = [0usize; 5];
            for _ in 0..COUNT {
                let r = tick(ms(dur));
                for _ in 0..COUNT {
                    select! {
                        recv(r) -> _ => hits[0] += 1,
                        recv(r) -> _ => hits[1] += 1,
                        recv(r) -> _ => hits[2] += 1,
                        recv(r) -> _ => hits[3] += 1,
                        recv(r) -> _ => hits[4] += 1,
                    }
                }
            }
            assert!(hits.iter().all(|x| *x >= COUNT / hits.len() / 2), "{dur}: {hits:?}");
        }
    }

    fn never_all() {
        select! { recv(never::<i32>()) -> _ => panic!(), default => {} }
        let (s, r) = unbounded::<i32>();
        s.send(1).unwrap();
        s.send(2).unwrap();
        let mut opt = Some(&r);
        select! { recv(opt.unwrap_or(&never())) -> _ => {}, default => panic!() }
        opt = None;
        select! { recv(opt.unwrap_or(&never())) -> _ => panic!(), default => {} }
        let r = never::<i32>();
        assert_eq!(r.capacity(), Some(0));
        assert_eq!((r.len(), r.is_empty(), r.is_full()), (0, true, true));
        assert!(r.try_recv().is_err());
        let start = Instant::now();
        assert_eq!(r.recv_timeout(ms(100)), Err(RecvTimeoutError::Timeout));
        assert!(start.elapsed() >= ms(100));
        assert_eq!(r.recv_timeout(ms(100)), Err(RecvTimeoutError::Timeout));
        assert!(start.elapsed() >= ms(200));
    }

    fn never_tick_n() {
        let mut r = tick(ms(20));
        let mut step = 0;
        loop {
            select! {
                recv(r) -> _ => step += 1,
                default(ms(200)) => break,
            }
            if step == 10 {
                r = never();
            }
        }
        assert_eq!(step, 10);
    }

    port!(
        after_fire,
        after_capacity_len,
        after_try_recv,
        after_recv_and_timeout,
        after_recv_two,
        recv_race,
        stress_default,
        after_select_many,
        after_ready_many,
        after_stress_clone,
        after_fairness,
        tick_fire,
        tick_intervals,
        tick_try_recv,
        tick_recv_timeout,
        tick_recv_two,
        tick_select_and_ready,
        tick_fairness,
        never_all,
        never_tick_n,
    );
}

// ---------------------------------------------------------------------------
// iter.rs, same_channel.rs, thread_locals.rs.

mod misc {
    use super::*;

    fn nested_recv_iter() {
        let (s, r) = unbounded::<i32>();
        let (total_s, total_r) = unbounded::<i32>();
        scope(|sc| {
            sc.spawn(move || {
                let acc: i32 = r.iter().sum();
                total_s.send(acc).unwrap();
            });
            s.send(3).unwrap();
            s.send(1).unwrap();
            s.send(2).unwrap();
            drop(s);
            assert_eq!(total_r.recv().unwrap(), 6);
        });
    }

    fn recv_iter_break() {
        let (s, r) = unbounded::<i32>();
        let (count_s, count_r) = unbounded();
        scope(|sc| {
            sc.spawn(move || {
                let mut count = 0;
                for x in r.iter() {
                    if count >= 3 {
                        break;
                    }
                    count += x;
                }
                count_s.send(count).unwrap();
            });
            s.send(2).unwrap();
            s.send(2).unwrap();
            s.send(2).unwrap();
            let _ = s.send(2);
            drop(s);
            assert_eq!(count_r.recv().unwrap(), 4);
        });
    }

    fn recv_try_iter() {
        let (request_s, request_r) = unbounded();
        let (response_s, response_r) = unbounded();
        scope(|sc| {
            sc.spawn(move || {
                let mut count = 0;
                loop {
                    for x in response_r.try_iter() {
                        count += x;
                        if count == 6 {
                            return;
                        }
                    }
                    request_s.send(()).unwrap();
                    relax();
                }
            });
            for _ in request_r.iter() {
                if response_s.send(2).is_err() {
                    break;
                }
            }
        });
    }

    fn recv_into_iter() {
        let mut iter = {
            let (s, r) = unbounded::<i32>();
            s.send(1).unwrap();
            s.send(2).unwrap();
            r.into_iter()
        };
        assert_eq!(iter.next(), Some(1));
        assert_eq!(iter.next(), Some(2));
        assert_eq!(iter.next(), None);
        let (s, r) = unbounded::<i32>();
        s.send(1).unwrap();
        s.send(2).unwrap();
        drop(s);
        let mut iter = (&r).into_iter();
        assert_eq!(iter.next(), Some(1));
        assert_eq!(iter.next(), Some(2));
        assert_eq!(iter.next(), None);
    }

    fn same_channel_all_flavors() {
        for (s, r) in [bounded::<usize>(0), bounded::<usize>(1), unbounded::<usize>()] {
            let (s2, r2) = (s.clone(), r.clone());
            assert!(s.same_channel(&s2) && r.same_channel(&r2));
            let (s3, r3) = (bounded::<usize>(1).0, unbounded::<usize>().1);
            assert!(!s.same_channel(&s3) && !s2.same_channel(&s3));
            assert!(!r.same_channel(&r3) && !r2.same_channel(&r3));
        }
        let (s1, r1) = bounded::<usize>(0);
        let (s2, r2) = unbounded::<usize>();
        assert!(!s1.same_channel(&s2) && !r1.same_channel(&r2));
        for make in [after as fn(Duration) -> Receiver<Instant>, tick] {
            let r = make(ms(50));
            let r2 = r.clone();
            assert!(r.same_channel(&r2));
            let r3 = make(ms(50));
            assert!(!r.same_channel(&r3) && !r2.same_channel(&r3));
            assert!(!r.same_channel(&make(ms(100))));
        }
        // "Never channels are always equal to one another."
        let r = never::<usize>();
        assert!(r.same_channel(&r.clone()));
        assert!(r.same_channel(&never::<usize>()));
    }

    fiber::fiber_local! {
        static FOO: Foo = const { Foo };
    }
    thread_local! {
        static TFOO: Foo = const { Foo };
    }
    struct Foo;
    impl Drop for Foo {
        fn drop(&mut self) {
            // A blocking channel operation while the thread (or fiber) is
            // tearing down its locals.
            let (_s, r) = unbounded::<()>();
            select! {
                recv(r) -> _ => {}
                default(ms(20)) => {}
            }
        }
    }

    fn use_while_exiting() {
        let (s, r) = unbounded::<()>();
        scope(|sc| {
            sc.spawn(|| {
                if in_fiber() {
                    FOO.with(|_| ());
                } else {
                    TFOO.with(|_| ());
                }
                r.recv().unwrap();
            });
            sc.spawn(|| {
                sleep(ms(20));
                s.send(()).unwrap();
            });
        });
    }

    port!(
        nested_recv_iter,
        recv_iter_break,
        recv_try_iter,
        recv_into_iter,
        same_channel_all_flavors,
        use_while_exiting,
    );
}
