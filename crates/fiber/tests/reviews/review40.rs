//! Review 40: Kotlin job semantics, std::thread and std::net contracts, and
//! adversarial programs, written from the documented behaviour.
//!
//! Attacked: cancelAndJoin against NonCancellable clean-up, supervisors
//! with failing children and failing nested scopes, job states while a
//! failing scope drains, nested and NonCancellable-overrun timeouts,
//! detached fibers inside scopes and timeouts, children spawning into their
//! own scope (also from a blocking call), failed `Builder::spawn_scoped`,
//! park tokens, builder stack-size extremes, misuse on plain threads,
//! several fibers waiting on one socket (recv, accept, read, write), a
//! cancelled accept, clone shutdowns, peek, UDP truncation and refusals,
//! zero timeouts, writes after close, Duration::MAX and zero-grace
//! shutdowns with blocking destructors and parked scopes.
//!
//! Found: no defect (two first drafts raced a child cancelled before its
//! first run, which by design never runs, as Kotlin's `launch`).
use crate::common::*;

use fiber::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use fiber::JobState;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- jobs

/// Kotlin: `cancelAndJoin` of a parent waits for a child that finishes
/// its clean-up in `withContext(NonCancellable)`.
#[test]
fn cancel_and_join_waits_for_a_child_cleaning_up_in_non_cancellable() {
    within(30, || {
        rt().block_on(|| {
            let done = Arc::new(AtomicBool::new(false));
            let (job_tx, job_rx) = fiber::chan::bounded(1);
            let (in_tx, in_rx) = fiber::chan::bounded(1);
            let (started_tx, started_rx) = fiber::chan::bounded(1);
            let d = done.clone();
            let owner = fiber::spawn(move || {
                fiber::scope(|s| {
                    job_tx.send(s.job()).unwrap();
                    s.spawn(move || {
                        started_tx.send(()).unwrap();
                        let _ = fiber::sleep(Duration::MAX);
                        fiber::non_cancellable(|| {
                            in_tx.send(()).unwrap();
                            fiber::sleep(ms(100)).unwrap();
                            d.store(true, SeqCst);
                        });
                    });
                });
            });
            let job = job_rx.recv().unwrap();
            // A child cancelled before its first run never runs: cancel
            // only once it started.
            started_rx.recv().unwrap();
            job.cancel();
            in_rx.recv().unwrap();
            let state = job.cancel_and_join().unwrap();
            assert!(
                done.load(SeqCst),
                "cancel_and_join returned before the child's clean-up"
            );
            assert_eq!(state, JobState::Cancelled);
            owner.join().unwrap();
        })
    });
}

/// Kotlin: a supervisor's failed child neither cancels its siblings nor
/// fails the supervisor, which completes normally.
#[test]
fn supervisor_with_a_failed_child_completes_and_its_sibling_finishes() {
    within(30, || {
        rt().block_on(|| {
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(0);
            let (job, a, b) = fiber::supervisor_scope(|s| {
                let a = s.spawn(|| -> u32 { panic!("child a fails") });
                let b = s.spawn(move || {
                    go_rx.recv().unwrap();
                    fiber::sleep(ms(5)).unwrap();
                    7u32
                });
                let a = a.join();
                go_tx.send(()).unwrap();
                (s.job(), a, b.join())
            });
            assert!(a.unwrap_err().is_panic());
            assert_eq!(b.unwrap(), 7);
            assert_eq!(job.state(), JobState::Completed);
        })
    });
}

/// A failure in a regular scope opened inside a supervisor's child fails
/// that child only; the supervisor's other child runs on undisturbed.
#[test]
fn failure_in_a_scope_inside_a_supervisor_child_stays_with_that_child() {
    within(30, || {
        rt().block_on(|| {
            let (a, b) = fiber::supervisor_scope(|s| {
                let a = s.spawn(|| {
                    fiber::scope(|inner| {
                        inner.spawn(|| -> () { panic!("grandchild fails") });
                        inner.spawn(|| fiber::sleep(Duration::MAX));
                    })
                });
                let b = s.spawn(|| fiber::sleep(ms(100)).is_ok());
                (a.join(), b.join())
            });
            let a = a.unwrap_err();
            assert!(a.is_panic(), "{a:?}");
            assert_eq!(a.downcast_ref::<&str>(), Some(&"grandchild fails"));
            assert!(b.unwrap(), "the sibling in the supervisor was cancelled");
        })
    });
}

/// Kotlin: cancelling one child (not a failure) does not cancel the parent
/// nor the siblings; the parent completes normally.
#[test]
fn cancelling_one_scoped_child_leaves_the_scope_completed() {
    within(30, || {
        rt().block_on(|| {
            let (job, a, b) = fiber::scope(|s| {
                let a = s.spawn(|| fiber::sleep(Duration::MAX));
                let b = s.spawn(|| fiber::sleep(ms(50)).is_ok());
                a.cancel();
                (s.job(), a.join(), b.join())
            });
            assert!(a.unwrap_err().is_cancelled());
            assert!(b.unwrap());
            assert_eq!(job.state(), JobState::Completed);
            assert!(!fiber::is_cancelled());
        })
    });
}

/// Kotlin: `withTimeout { withContext(NonCancellable) { delay(long) } }`:
/// the section runs to its end, then the block reports the timeout.
#[test]
fn with_timeout_around_an_overrunning_non_cancellable_section_times_out_after_it() {
    within(30, || {
        rt().block_on(|| {
            let start = Instant::now();
            let slept = Arc::new(AtomicBool::new(false));
            let s = slept.clone();
            let r = fiber::with_timeout(ms(20), move || {
                fiber::non_cancellable(|| {
                    fiber::sleep(ms(150)).unwrap();
                    s.store(true, SeqCst);
                });
                fiber::sleep(Duration::MAX).is_err()
            });
            assert!(r.is_err(), "{r:?}");
            assert!(slept.load(SeqCst));
            assert!(start.elapsed() >= ms(150));
        })
    });
}

/// Nested timeouts: the outer (shorter) deadline ends both blocks.
#[test]
fn nested_with_timeout_the_shorter_outer_deadline_ends_both() {
    within(30, || {
        rt().block_on(|| {
            let start = Instant::now();
            let r = fiber::with_timeout(ms(30), || {
                fiber::with_timeout(Duration::from_secs(20), || fiber::sleep(Duration::MAX))
            });
            assert!(r.is_err(), "{r:?}");
            assert!(start.elapsed() < Duration::from_secs(10));
        })
    });
}

/// A fiber spawned (detached) inside a `with_timeout` block is not cut by
/// the block's deadline (as `GlobalScope.launch` inside `withTimeout`).
#[test]
fn a_detached_fiber_spawned_inside_with_timeout_outlives_the_deadline() {
    within(30, || {
        rt().block_on(|| {
            let (tx, rx) = fiber::chan::bounded(1);
            let r = fiber::with_timeout(ms(20), move || {
                let h = fiber::spawn(|| fiber::sleep(ms(100)).map(|_| 42).map_err(|_| "cancelled"));
                tx.send(h).unwrap();
                fiber::sleep(Duration::MAX)
            });
            assert!(r.is_err());
            let h = rx.recv().unwrap();
            assert_eq!(h.join().unwrap(), Ok(42));
        })
    });
}

/// std: a scope whose body panics re-raises only after every child ended.
#[test]
fn a_scope_whose_body_panics_reraises_after_its_children_ended() {
    within(30, || {
        rt().block_on(|| {
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            let msg = panic_message(move || {
                fiber::scope(|s| {
                    let (in_tx, in_rx) = fiber::chan::bounded(1);
                    s.spawn(move || {
                        fiber::non_cancellable(|| {
                            in_tx.send(()).unwrap();
                            fiber::sleep(ms(100)).unwrap();
                            d.store(true, SeqCst);
                        })
                    });
                    in_rx.recv().unwrap();
                    panic!("body fails");
                })
            });
            assert_eq!(msg.as_deref(), Some("body fails"));
            assert!(done.load(SeqCst), "the scope re-raised before its child ended");
        })
    });
}

/// std: a detached `spawn` inside a scoped child is not waited for by the
/// scope, and is not cancelled when the scope closes.
#[test]
fn a_detached_grandchild_is_neither_waited_for_nor_cancelled_by_the_scope() {
    within(30, || {
        rt().block_on(|| {
            let (go_tx, go_rx) = fiber::chan::bounded::<u32>(0);
            let h = fiber::scope(|s| {
                s.spawn(move || fiber::spawn(move || go_rx.recv().unwrap() + 1))
                    .join()
                    .unwrap()
            });
            assert!(!h.is_finished());
            go_tx.send(41).unwrap();
            assert_eq!(h.join().unwrap(), 42);
        })
    });
}

// ---------------------------------------------------------------- thread

/// std: two unparks make one token: the first park returns, the second
/// waits for its timeout.
#[test]
fn unpark_tokens_do_not_accumulate() {
    within(30, || {
        rt().block_on(|| {
            let me = fiber::current();
            me.unpark();
            me.unpark();
            fiber::park();
            let start = Instant::now();
            fiber::park_timeout(ms(50));
            assert!(start.elapsed() >= ms(50), "a second token was kept");
        })
    });
}

/// Builder: absurd stack sizes are errors, tiny ones work (std rounds up).
#[test]
fn builder_stack_sizes_at_the_extremes() {
    within(30, || {
        rt().block_on(|| {
            let e = fiber::Builder::new().stack_size(usize::MAX).spawn(|| 1).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            let e = fiber::Builder::new().stack_size((1 << 30) + 1).spawn(|| 1).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            for size in [0, 1, 4095] {
                let h = fiber::Builder::new().stack_size(size).spawn(move || size + 1).unwrap();
                assert_eq!(h.join().unwrap(), size + 1);
            }
        })
    });
}

/// Misuse from a plain thread: fiber-only calls fail loudly, never hang.
#[test]
fn fiber_calls_on_a_plain_thread_without_a_runtime_never_hang() {
    within(30, || {
        assert!(panic_message(|| fiber::with_timeout(ms(10), || 1).map(drop).unwrap()).is_some());
        assert!(panic_message(|| fiber::Job::current().cancel()).is_some());
        assert!(panic_message(|| {
            fiber::spawn(|| 1);
        })
        .is_some());
        // The cancellation queries on a plain thread report "not cancelled".
        assert!(!fiber::is_cancelled());
        assert!(fiber::check_cancelled().is_ok());
        // non_cancellable just runs its closure.
        assert_eq!(fiber::non_cancellable(|| 5), 5);
    });
}

// ---------------------------------------------------------------- net

/// Two fibers parked in `recv_from` on one UDP socket: two datagrams
/// arriving together wake both (no lost wake-up on one edge).
#[test]
fn two_fibers_receiving_on_one_udp_socket_both_get_a_datagram() {
    within(30, || {
        rt2().block_on(|| {
            let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let addr = sock.local_addr().unwrap();
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let sock = sock.clone();
                    fiber::spawn(move || {
                        let mut buf = [0u8; 16];
                        let (n, _) = sock.recv_from(&mut buf).unwrap();
                        buf[..n].to_vec()
                    })
                })
                .collect();
            for h in &hs {
                wait_fiber_parked(h.id());
            }
            let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.send_to(b"one", addr).unwrap();
            tx.send_to(b"two", addr).unwrap();
            let mut got: Vec<Vec<u8>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            got.sort();
            assert_eq!(got, vec![b"one".to_vec(), b"two".to_vec()]);
        })
    });
}

/// Two fibers parked in `accept` on one listener: two connections arriving
/// together are both accepted.
#[test]
fn two_fibers_accepting_on_one_listener_both_get_a_connection() {
    within(30, || {
        rt2().block_on(|| {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = l.local_addr().unwrap();
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    fiber::spawn(move || {
                        let (mut s, _) = l.accept().unwrap();
                        let mut b = [0u8; 1];
                        s.read_exact(&mut b).unwrap();
                        b[0]
                    })
                })
                .collect();
            for h in &hs {
                wait_fiber_parked(h.id());
            }
            let mut c1 = std::net::TcpStream::connect(addr).unwrap();
            let mut c2 = std::net::TcpStream::connect(addr).unwrap();
            c1.write_all(b"a").unwrap();
            c2.write_all(b"b").unwrap();
            let mut got: Vec<u8> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            got.sort();
            assert_eq!(got, b"ab");
        })
    });
}

/// Two fibers parked in `read` on one stream (`&TcpStream`): a byte then
/// the peer's close end both reads (one gets the byte, the other EOF).
#[test]
fn two_readers_on_one_stream_both_return_on_data_then_close() {
    within(30, || {
        rt2().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let s = Arc::new(s);
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let s = s.clone();
                    fiber::spawn(move || {
                        let mut b = [0u8; 8];
                        (&*s).read(&mut b).unwrap()
                    })
                })
                .collect();
            for h in &hs {
                wait_fiber_parked(h.id());
            }
            c.write_all(b"x").unwrap();
            drop(c);
            let mut got: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            got.sort();
            assert_eq!(got, vec![0, 1]);
        })
    });
}

/// std: zero timeouts are `InvalidInput` on every socket type, and leave
/// the previous timeout in place.
#[test]
fn zero_socket_timeouts_are_invalid_input_and_change_nothing() {
    within(30, || {
        rt().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            c.set_read_timeout(Some(ms(300))).unwrap();
            let e = c.set_read_timeout(Some(Duration::ZERO)).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert_eq!(c.read_timeout().unwrap(), Some(ms(300)));
            let e = c.set_write_timeout(Some(Duration::ZERO)).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            assert_eq!(c.write_timeout().unwrap(), None);
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            assert_eq!(
                u.set_read_timeout(Some(Duration::ZERO)).unwrap_err().kind(),
                std::io::ErrorKind::InvalidInput
            );
            assert_eq!(u.read_timeout().unwrap(), None);
            let e = TcpStream::connect_timeout(&l.local_addr().unwrap(), Duration::ZERO).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        })
    });
}

/// std: after the peer closed, writes fail with `BrokenPipe` or
/// `ConnectionReset` (no SIGPIPE death), vectored writes included.
#[test]
fn writes_after_the_peer_closed_fail_without_killing_the_process() {
    within(30, || {
        rt().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            drop(s);
            let kind = write_until_error(|| c.write_vectored(&[std::io::IoSlice::new(&[1u8; 1024])]));
            assert!(
                matches!(
                    kind,
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ),
                "{kind:?}"
            );
            let kind = write_until_error(|| c.write(&[1u8; 16]));
            assert!(
                matches!(
                    kind,
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ),
                "{kind:?}"
            );
        })
    });
}

/// std: `shutdown(Read)` through a clone ends a read parked on the
/// original with `Ok(0)`; `shutdown(Write)` is seen as EOF by the peer.
#[test]
fn shutdowns_through_a_clone_reach_the_original_and_the_peer() {
    within(30, || {
        rt2().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let clone = s.try_clone().unwrap();
            let reader = fiber::spawn(move || {
                let mut b = [0u8; 8];
                let n = (&s).read(&mut b).unwrap();
                (n, s)
            });
            wait_fiber_parked(reader.id());
            clone.shutdown(Shutdown::Both).unwrap();
            let (n, _s) = reader.join().unwrap();
            assert_eq!(n, 0);
            peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = [0u8; 8];
            assert_eq!(peer.read(&mut b).unwrap(), 0);
        })
    });
}

/// std: `peek` does not consume; a later `read` gets the same bytes.
#[test]
fn peek_parks_until_data_then_read_returns_the_same_bytes() {
    within(30, || {
        rt2().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let h = fiber::spawn(move || {
                let mut b = [0u8; 64];
                let n = s.peek(&mut b).unwrap();
                let mut r = vec![0u8; n];
                (&s).read_exact(&mut r).unwrap();
                (b[..n].to_vec(), r)
            });
            wait_fiber_parked(h.id());
            peer.write_all(b"hello").unwrap();
            let (peeked, read) = h.join().unwrap();
            assert_eq!(peeked, read);
            assert!(!peeked.is_empty());
        })
    });
}

/// std: a connected UDP socket that sent to a closed port gets
/// `ConnectionRefused` on its next receive (even a parked one).
#[test]
fn connected_udp_refused_reaches_a_parked_receive() {
    within(30, || {
        rt2().block_on(|| {
            let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let target = closed.local_addr().unwrap();
            drop(closed);
            let u = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            u.connect(target).unwrap();
            let u2 = u.clone();
            let h = fiber::spawn(move || {
                let mut b = [0u8; 8];
                u2.recv(&mut b).map_err(|e| e.kind())
            });
            wait_fiber_parked(h.id());
            u.send(b"ping").unwrap();
            assert_eq!(h.join().unwrap(), Err(std::io::ErrorKind::ConnectionRefused));
        })
    });
}

// ---------------------------------------------------------------- adversarial

/// A fiber cancelled at shutdown whose destructor waits in
/// `non_cancellable` finishes that wait within the grace time.
#[test]
fn a_blocking_destructor_in_non_cancellable_finishes_within_the_grace() {
    within(30, || {
        struct Flush(Arc<AtomicBool>);
        impl Drop for Flush {
            fn drop(&mut self) {
                fiber::non_cancellable(|| fiber::sleep(ms(50)).unwrap());
                self.0.store(true, SeqCst);
            }
        }
        let flushed = Arc::new(AtomicBool::new(false));
        let rt = rt_fixed_grace(2, Duration::from_secs(5));
        let f = flushed.clone();
        rt.spawn(move || {
            let _g = Flush(f);
            let _ = fiber::sleep(Duration::MAX);
        });
        wait_parked(&rt, 1);
        let start = Instant::now();
        drop(rt);
        assert!(flushed.load(SeqCst), "the destructor's flush was cut");
        assert!(start.elapsed() < Duration::from_secs(4));
    });
}

/// Shutdown with a detached fiber parked in a scope's join: the children
/// are cancelled, the scope closes and its job ends CANCELLED.
#[test]
fn shutdown_with_a_parked_scope_ends_its_job_cancelled() {
    within(30, || {
        let rt = rt_fixed_grace(2, Duration::from_secs(5));
        let (tx, rx) = std::sync::mpsc::channel();
        let ended = Arc::new(AtomicUsize::new(0));
        let e = ended.clone();
        rt.spawn(move || {
            fiber::scope(|s| {
                tx.send(s.job()).unwrap();
                for _ in 0..3 {
                    let e = e.clone();
                    s.spawn(move || {
                        let r = fiber::sleep(Duration::MAX);
                        e.fetch_add(1, SeqCst);
                        r
                    });
                }
            })
        });
        let job = rx.recv().unwrap();
        wait_parked(&rt, 4);
        drop(rt);
        assert_eq!(ended.load(SeqCst), 3);
        assert_eq!(job.state(), JobState::Cancelled);
    });
}

// ---------------------------------------------------------------- batch 2

/// std: a `Builder::spawn_scoped` that fails returns the error and
/// leaves the scope alone: the scope returns normally, siblings run on.
#[test]
fn a_failed_builder_spawn_scoped_does_not_fail_or_cancel_the_scope() {
    within(30, || {
        rt().block_on(|| {
            let (job, sib, err) = fiber::scope(|s| {
                let sib = s.spawn(|| fiber::sleep(ms(50)).is_ok());
                let err = fiber::Builder::new()
                    .stack_size(usize::MAX)
                    .spawn_scoped(s, || 1)
                    .map(|_| ())
                    .unwrap_err();
                (s.job(), sib.join(), err)
            });
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
            assert!(sib.unwrap(), "the sibling was cancelled");
            assert_eq!(job.state(), JobState::Completed);
        })
    });
}

/// std: a scoped child may spawn into its own scope; the scope waits for
/// every descendant spawned so, even after its body returned.
#[test]
fn a_chain_of_children_spawning_into_their_scope_is_all_waited_for() {
    within(30, || {
        rt().block_on(|| {
            fn link<'scope, 'env>(s: &'scope fiber::Scope<'scope, 'env>, n: usize, count: &'env AtomicUsize) {
                count.fetch_add(1, SeqCst);
                if n > 0 {
                    fiber::yield_now().unwrap();
                    s.spawn(move || link(s, n - 1, count));
                }
            }
            let count = AtomicUsize::new(0);
            fiber::scope(|s| {
                let count = &count;
                s.spawn(move || link(s, 49, count));
            });
            assert_eq!(count.load(SeqCst), 50);
        })
    });
}

/// Kotlin: children of a `withTimeout` block are cancelled by its
/// deadline with the timeout as the reason.
#[test]
fn a_child_cut_by_with_timeout_reports_timed_out() {
    within(30, || {
        rt().block_on(|| {
            let (tx, rx) = fiber::chan::bounded(1);
            let r = fiber::with_timeout(ms(30), move || {
                fiber::scope(|s| {
                    let h = s.spawn(|| fiber::sleep(Duration::MAX));
                    let j = h.join();
                    tx.send(j.map_err(|e| (e.is_timed_out(), e.is_cancelled()))).unwrap();
                })
            });
            assert!(r.is_err());
            assert_eq!(rx.recv().unwrap().unwrap_err(), (true, true));
        })
    });
}

/// Two fibers writing on one stream with a full buffer: both writes
/// complete once the peer reads (no lost wake-up with two writers).
#[test]
fn two_writers_on_one_full_stream_both_finish() {
    within(30, || {
        rt2().block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let mut peer = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (s, _) = l.accept().unwrap();
            let s = Arc::new(s);
            const N: usize = 4 << 20;
            let hs: Vec<_> = (0..2u8)
                .map(|i| {
                    let s = s.clone();
                    fiber::spawn(move || (&*s).write_all(&vec![i; N]).is_ok())
                })
                .collect();
            for h in &hs {
                wait_fiber_parked(h.id());
            }
            let reader = std::thread::spawn(move || {
                let mut total = 0;
                let mut b = vec![0u8; 65536];
                while total < 2 * N {
                    let n = peer.read(&mut b).unwrap();
                    assert!(n > 0);
                    total += n;
                }
                total
            });
            for h in hs {
                assert!(h.join().unwrap());
            }
            assert_eq!(reader.join().unwrap(), 2 * N);
        })
    });
}

/// A cancelled `accept` leaves the listener usable: the next accept (by
/// another fiber) gets the next connection.
#[test]
fn a_cancelled_accept_leaves_the_listener_usable() {
    within(30, || {
        rt2().block_on(|| {
            let l = Arc::new(TcpListener::bind("127.0.0.1:0").unwrap());
            let addr = l.local_addr().unwrap();
            let l1 = l.clone();
            let (tx, rx) = fiber::chan::bounded(1);
            let a = fiber::spawn(move || {
                let e = l1.accept().map(|_| ()).unwrap_err();
                let cancelled = e.get_ref().is_some_and(|i| i.is::<fiber::Cancelled>());
                tx.send((e.kind(), cancelled)).unwrap();
            });
            wait_fiber_parked(a.id());
            a.cancel();
            // A fiber cancelled before it returned ends cancelled.
            assert!(a.join().unwrap_err().is_cancelled());
            assert_eq!(rx.recv().unwrap(), (std::io::ErrorKind::Other, true));
            let l2 = l.clone();
            let b = fiber::spawn(move || l2.accept().map(|(_, p)| p));
            wait_fiber_parked(b.id());
            let c = std::net::TcpStream::connect(addr).unwrap();
            assert_eq!(b.join().unwrap().unwrap(), c.local_addr().unwrap());
        })
    });
}

/// Kotlin: a job whose child failed is "cancelling" (not completed, not
/// active, reason ChildFailed) while a sibling finishes its clean-up,
/// then FAILED (and completed, cancelled).
#[test]
fn a_failing_scopes_job_reads_cancelling_until_its_last_child_ends() {
    within(30, || {
        rt().block_on(|| {
            let (job_tx, job_rx) = fiber::chan::bounded(1);
            let (in_tx, in_rx) = fiber::chan::bounded(1);
            let (go_tx, go_rx) = fiber::chan::bounded::<()>(1);
            let owner = fiber::spawn(move || {
                fiber::scope(|s| {
                    job_tx.send(s.job()).unwrap();
                    s.spawn(move || {
                        fiber::non_cancellable(|| {
                            in_tx.send(()).unwrap();
                            go_rx.recv().unwrap();
                        })
                    });
                    // The failing sibling only once the first is in its
                    // section (a child cancelled before its first run
                    // never runs).
                    in_rx.recv().unwrap();
                    s.spawn(|| -> () { panic!("fails") });
                })
            });
            let job = job_rx.recv().unwrap();
            wait_until("the scope to start cancelling", 10, || job.state() != JobState::Active);
            assert_eq!(job.state(), JobState::Cancelling);
            assert!(!job.is_active());
            assert!(!job.is_completed());
            assert!(job.is_cancelled());
            assert_eq!(job.cancel_reason(), Some(fiber::CancelReason::ChildFailed));
            go_tx.send(()).unwrap();
            assert_eq!(job.join().unwrap(), JobState::Failed);
            assert!(job.is_completed() && job.is_cancelled() && !job.is_active());
            assert!(owner.join().unwrap_err().is_panic());
        })
    });
}

/// A scope borrowed into a `fiber::blocking` call: the pool thread spawns
/// a child into it and joins it.
#[test]
fn a_blocking_call_spawns_into_and_joins_from_a_borrowed_scope() {
    within(30, || {
        rt().block_on(|| {
            let base = 40;
            let v = fiber::scope(|s| fiber::blocking(|| s.spawn(|| base + 2).join().unwrap()));
            assert_eq!(v, 42);
        })
    });
}

/// `Duration::MAX` settings build a runtime that still shuts down at once
/// when its fibers end on cancellation.
#[test]
fn a_runtime_with_duration_max_settings_shuts_down_promptly() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .idle_timeout(Duration::MAX)
            .shutdown_timeout(Duration::MAX)
            .build()
            .unwrap();
        let hs: Vec<_> = (0..4).map(|_| rt.spawn(|| fiber::sleep(Duration::MAX))).collect();
        wait_parked(&rt, 4);
        let start = Instant::now();
        drop(rt);
        assert!(start.elapsed() < Duration::from_secs(10));
        for h in hs {
            assert!(h.join().unwrap_err().is_cancelled());
        }
    });
}

/// `shutdown_timeout(ZERO)`: no grace, yet every parked fiber is unwound
/// (its destructors run) before the call returns.
#[test]
fn shutdown_with_zero_grace_still_runs_every_destructor() {
    within(30, || {
        struct Count(Arc<AtomicUsize>);
        impl Drop for Count {
            fn drop(&mut self) {
                self.0.fetch_add(1, SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let rt = rt2();
        for _ in 0..8 {
            let c = Count(dropped.clone());
            rt.spawn(move || {
                let _c = c;
                stubborn_sleep();
            });
        }
        wait_parked(&rt, 8);
        rt.shutdown_timeout(Duration::ZERO);
        assert_eq!(dropped.load(SeqCst), 8);
    });
}

/// std (UDP): a truncating `peek_from` keeps the datagram whole for the
/// next receive; a truncating `recv_from` discards the rest.
#[test]
fn udp_peek_truncates_without_consuming_and_recv_discards_the_rest() {
    within(30, || {
        rt().block_on(|| {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            let from = a.local_addr().unwrap();
            a.send_to(b"0123456789", b.local_addr().unwrap()).unwrap();
            a.send_to(b"abcdef", b.local_addr().unwrap()).unwrap();
            let mut small = [0u8; 4];
            assert_eq!(b.peek_from(&mut small).unwrap(), (4, from));
            assert_eq!(&small, b"0123");
            let mut big = [0u8; 16];
            assert_eq!(b.recv_from(&mut big).unwrap(), (10, from));
            assert_eq!(&big[..10], b"0123456789");
            assert_eq!(b.recv_from(&mut small).unwrap(), (4, from));
            assert_eq!(&small, b"abcd");
            b.set_nonblocking(true).unwrap();
            assert_eq!(
                b.recv_from(&mut big).unwrap_err().kind(),
                std::io::ErrorKind::WouldBlock,
                "the truncated datagram's rest was kept"
            );
            // Unconnected: no peer, and `send` has nowhere to go.
            assert_eq!(b.peer_addr().unwrap_err().kind(), std::io::ErrorKind::NotConnected);
            assert!(b.send(b"x").is_err());
        })
    });
}

/// std (TCP), on a plain thread and in a fiber: a refused connect, a
/// write after one's own `shutdown(Write)`, non-blocking `WouldBlock`s,
/// `take_error` empty, addresses consistent.
#[test]
fn tcp_std_contracts_hold_on_a_thread_and_in_a_fiber() {
    fn check() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = closed.local_addr().unwrap();
        drop(closed);
        assert_eq!(
            TcpStream::connect(dead).unwrap_err().kind(),
            std::io::ErrorKind::ConnectionRefused
        );
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        // Each address in turn: the refused one first, then the live one.
        let mut c = TcpStream::connect(&[dead, l.local_addr().unwrap()][..]).unwrap();
        let (s, peer) = l.accept().unwrap();
        assert_eq!(peer, c.local_addr().unwrap());
        assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
        assert_eq!(c.peer_addr().unwrap(), l.local_addr().unwrap());
        assert!(c.take_error().unwrap().is_none());
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 4];
        assert_eq!(s.peek(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        assert_eq!((&s).read(&mut b).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        c.write_all(b"ab").unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        assert_eq!(c.write(b"x").unwrap_err().kind(), std::io::ErrorKind::BrokenPipe);
        s.set_nonblocking(false).unwrap();
        let mut all = Vec::new();
        (&s).read_to_end(&mut all).unwrap();
        assert_eq!(all, b"ab");
    }
    within(30, || {
        check();
        rt().block_on(check);
    });
}
