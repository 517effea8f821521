//! Review 35: the documented promises, checked the way a user of the std /
//! crossbeam-channel / Go / Kotlin equivalent expects them to hold: timer
//! and `never` channels' `len` / `is_full` / `same_channel`, `Select` with
//! no operations, park tokens and zero timeouts, poisoning, `OnceLock`
//! hand-over after a panicking initializer, `Barrier` / `Semaphore` edge
//! counts, `with_timeout(Duration::MAX)`, and `std::net` parity (zero
//! timeouts, unconnected UDP sockets, non-blocking accept, host names that
//! resolve to several addresses), each compared with std's own answer at
//! run time where std can run the same call.
use crate::common::*;

use fiber::chan::{self, after, at, bounded, never, tick, unbounded, Select};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------- channels

/// crossbeam's `at` flavor: `len` is 1 while the message is due and not
/// taken, `is_full` then, `capacity` 1; after the receive the channel is
/// empty (not disconnected).
#[test]
fn a_due_timer_channel_counts_its_message_like_crossbeam() {
    within(10, || {
        let r = at(Instant::now() - ms(1));
        assert_eq!(r.capacity(), Some(1));
        assert_eq!(r.len(), 1);
        assert!(r.is_full());
        assert!(!r.is_empty());
        assert!(r.recv().is_ok());
        assert_eq!(r.len(), 0);
        assert!(r.is_empty());
        assert!(!r.is_full());
        assert_eq!(r.try_recv(), Err(chan::TryRecvError::Empty));
        assert_eq!(r.recv_timeout(ms(5)), Err(chan::RecvTimeoutError::Timeout));
        let t = tick(Duration::from_secs(3600));
        assert_eq!(t.capacity(), Some(1));
        assert_eq!(t.len(), 0);
        assert!(t.is_empty());
    });
}

/// crossbeam's `never`: capacity 0, empty and full at once, and every
/// `never()` is the same channel.
#[test]
fn never_is_empty_full_and_one_channel_like_crossbeam() {
    within(10, || {
        let a = never::<u8>();
        let b = never::<u8>();
        assert_eq!(a.capacity(), Some(0));
        assert_eq!(a.len(), 0);
        assert!(a.is_empty() && a.is_full());
        assert!(a.same_channel(&b));
        assert!(!a.same_channel(&bounded::<u8>(1).1));
        assert_eq!(a.try_recv(), Err(chan::TryRecvError::Empty));
        assert_eq!(a.recv_timeout(Duration::ZERO), Err(chan::RecvTimeoutError::Timeout));
        let t1 = after(ms(10));
        let t2 = t1.clone();
        assert!(t1.same_channel(&t2));
        assert!(!t1.same_channel(&after(ms(10))));
    });
}

/// crossbeam's zero-capacity flavor: `is_empty` and `is_full` are both
/// true, `len` 0, even while a sender waits.
#[test]
fn a_rendezvous_channel_is_empty_and_full_even_with_a_parked_sender() {
    within(10, || {
        rt2().block_on(|| {
            let (tx, rx) = bounded::<u32>(0);
            let t2 = tx.clone();
            let h = fiber::spawn(move || t2.send(7));
            wait_until("a parked sender", 5, || tx.waiting().1 == 1);
            for (len, empty, full) in [
                (tx.len(), tx.is_empty(), tx.is_full()),
                (rx.len(), rx.is_empty(), rx.is_full()),
            ] {
                assert_eq!((len, empty, full), (0, true, true));
            }
            assert_eq!(rx.recv(), Ok(7));
            h.join().unwrap().unwrap();
        })
    });
}

/// `try_iter` is not fused: it yields what is there, stops, and yields
/// again after a new send (crossbeam's `TryIter`).
#[test]
fn try_iter_yields_again_after_a_new_send() {
    within(10, || {
        let (tx, rx) = unbounded();
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        let mut it = rx.try_iter();
        assert_eq!(it.next(), Some(1));
        assert_eq!(it.next(), Some(2));
        assert_eq!(it.next(), None);
        tx.send(3).unwrap();
        assert_eq!(it.next(), Some(3));
        drop(tx);
        assert_eq!(it.next(), None);
    });
}

/// crossbeam: `Select::try_select` with no operations is
/// `Err(TrySelectError)`, `select_timeout` waits out its timeout and fails.
#[test]
fn an_empty_select_polls_and_times_out_like_crossbeam() {
    within(10, || {
        let mut sel = Select::new();
        assert!(sel.try_select().is_err());
        assert!(sel.try_ready().is_err());
        let start = Instant::now();
        assert!(sel.select_timeout(ms(20)).is_err());
        assert!(start.elapsed() >= ms(20));
        assert!(sel.ready_timeout(ms(1)).is_err());
        rt1().block_on(|| {
            let mut sel = Select::new();
            assert!(sel.try_select().is_err());
            let start = Instant::now();
            assert!(sel.select_timeout(ms(20)).is_err());
            assert!(start.elapsed() >= ms(20));
        });
    });
}

/// A receive with a deadline already passed still takes a value that is
/// there (crossbeam's `recv_deadline`); a send with `Duration::MAX` on a
/// channel with room succeeds.
#[test]
fn past_deadlines_still_take_ready_values_and_max_timeouts_send() {
    within(10, || {
        let check = || {
            let (tx, rx) = bounded(1);
            assert_eq!(tx.send_timeout(5, Duration::MAX), Ok(()));
            assert_eq!(rx.recv_deadline(Instant::now() - ms(5)), Ok(5));
            assert_eq!(tx.send_deadline(6, Instant::now() - ms(5)), Ok(()));
            assert_eq!(rx.recv_timeout(Duration::ZERO), Ok(6));
            drop(tx);
            assert_eq!(
                rx.recv_timeout(Duration::MAX),
                Err(chan::RecvTimeoutError::Disconnected)
            );
        };
        check();
        rt1().block_on(check);
    });
}

// ---------------------------------------------------------------- sync

/// std: a guard dropped by a panic poisons; `try_lock` then says
/// `Poisoned`, `into_inner` gives the value in the error, `clear_poison`
/// clears. Here the panic is a fiber's.
#[test]
fn a_fiber_panic_poisons_a_mutex_the_std_way() {
    use fiber::sync::{Mutex, TryLockError};
    use std::sync::Arc;
    within(10, || {
        rt2().block_on(|| {
            let m = Arc::new(Mutex::new(1));
            let m2 = m.clone();
            let h = fiber::spawn(move || {
                let _g = m2.lock().unwrap();
                panic!("poison it");
            });
            assert!(h.join().unwrap_err().is_panic());
            assert!(m.is_poisoned());
            assert!(matches!(m.try_lock(), Err(TryLockError::Poisoned(_))));
            assert_eq!(*m.lock().unwrap_err().into_inner(), 1);
            assert_eq!(format!("{m:?}"), "Mutex { data: 1, poisoned: true, .. }");
            m.clear_poison();
            assert!(!m.is_poisoned());
            assert_eq!(*m.lock().unwrap(), 1);
            let m = Arc::try_unwrap(m).unwrap();
            assert_eq!(m.into_inner().unwrap(), 1);
        })
    });
}

/// std's `RwLock`: a writer's panic poisons, a reader's does not.
#[test]
fn rwlock_poisoning_is_for_writers_only() {
    use fiber::sync::RwLock;
    use std::sync::Arc;
    within(10, || {
        rt2().block_on(|| {
            let l = Arc::new(RwLock::new(0));
            let l2 = l.clone();
            let _ = fiber::spawn(move || {
                let _g = l2.read().unwrap();
                panic!("reader");
            })
            .join();
            assert!(!l.is_poisoned());
            let l2 = l.clone();
            let _ = fiber::spawn(move || {
                let _g = l2.write().unwrap();
                panic!("writer");
            })
            .join();
            assert!(l.is_poisoned());
            assert!(l.read().is_err());
            assert!(matches!(l.try_write(), Err(fiber::sync::TryLockError::Poisoned(_))));
        })
    });
}

/// std's `OnceLock::get_or_init`: if the initializer panics, the panic
/// propagates, the cell stays empty, and a waiting caller initializes it.
#[test]
fn a_panicking_once_lock_initializer_hands_over_to_a_waiter() {
    use fiber::sync::OnceLock;
    use std::sync::Arc;
    within(10, || {
        rt2().block_on(|| {
            let cell = Arc::new(OnceLock::<u32>::new());
            let (started_tx, started_rx) = bounded(0);
            let (go_tx, go_rx) = bounded::<()>(0);
            let c = cell.clone();
            let first = fiber::spawn(move || {
                c.get_or_init(|| {
                    started_tx.send(()).unwrap();
                    let _ = go_rx.recv();
                    panic!("init fails");
                });
            });
            started_rx.recv().unwrap();
            let c = cell.clone();
            let second = fiber::spawn(move || *c.get_or_init(|| 2));
            wait_fiber_parked(second.id());
            drop(go_tx);
            assert!(first.join().unwrap_err().is_panic());
            assert_eq!(second.join().unwrap(), 2);
            assert_eq!(cell.get(), Some(&2));
            assert_eq!(cell.set(3), Err(3));
            assert_eq!(format!("{cell:?}"), "OnceLock(2)");
            assert_eq!(format!("{:?}", OnceLock::<u8>::new()), "OnceLock(<uninit>)");
        })
    });
}

/// A `Barrier` of 0 or 1 never waits and every caller leads (std).
#[test]
fn barriers_of_zero_and_one_lead_at_once() {
    within(10, || {
        let run = || {
            for n in [0, 1] {
                let b = fiber::sync::Barrier::new(n);
                for _ in 0..3 {
                    assert!(b.wait().is_leader());
                }
            }
        };
        run();
        rt1().block_on(run);
    });
}

/// Condvar: `wait_timeout_while` whose condition is already false returns
/// at once, not timed out; `wait_timeout(Duration::MAX)` ends on a notify.
#[test]
fn condvar_timed_waits_with_edge_durations() {
    use fiber::sync::{Condvar, Mutex};
    use std::sync::Arc;
    within(10, || {
        rt2().block_on(|| {
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let (m, cv) = &*pair;
            let g = m.lock().unwrap();
            let (g, r) = cv.wait_timeout_while(g, Duration::MAX, |ready| *ready).unwrap();
            assert!(!r.timed_out());
            drop(g);
            let p = pair.clone();
            let g = m.lock().unwrap();
            let h = fiber::spawn(move || {
                *p.0.lock().unwrap() = true;
                p.1.notify_one();
            });
            let (g, r) = cv.wait_timeout_while(g, Duration::MAX, |ready| !*ready).unwrap();
            assert!(!r.timed_out() && *g);
            drop(g);
            h.join().unwrap();
            let g = m.lock().unwrap();
            let (_g, r) = cv.wait_timeout(g, Duration::ZERO).unwrap();
            assert!(r.timed_out());
        })
    });
}

/// tokio's semaphore: zero permits are granted at once even with none free.
#[test]
fn zero_permit_acquires_are_granted_at_once() {
    within(10, || {
        rt1().block_on(|| {
            let s = fiber::sync::Semaphore::new(0);
            let p = s.acquire_many(0).unwrap();
            assert_eq!(p.num_permits(), 0);
            assert_eq!(s.try_acquire_many(0).map(|p| p.num_permits()), Some(0));
            drop(p);
            assert_eq!(s.available_permits(), 0);
            s.add_permits(2);
            let p = s.acquire_many(2).unwrap();
            assert_eq!(s.available_permits(), 0);
            drop(p);
            assert_eq!(s.available_permits(), 2);
        })
    });
}

// ---------------------------------------------------------------- thread

/// std's park token: a zero `park_timeout` consumes an available token,
/// so the next timed park waits its full time.
#[test]
fn a_zero_park_timeout_consumes_the_token() {
    within(10, || {
        rt1().block_on(|| {
            fiber::current().unpark();
            fiber::park_timeout(Duration::ZERO);
            let start = Instant::now();
            fiber::park_timeout(ms(30));
            assert!(start.elapsed() >= ms(30), "the token was not consumed");
        })
    });
}

/// `is_finished` turns true once the fiber ended, before any join; the
/// handle's `fiber()` names the fiber as `current()` does inside it.
#[test]
fn is_finished_and_fiber_handle_agree_with_current() {
    within(10, || {
        rt2().block_on(|| {
            let (tx, rx) = bounded(0);
            let h = fiber::Builder::new()
                .name("probe")
                .spawn(move || {
                    let me = fiber::current();
                    tx.send((me.id(), me.name().map(str::to_owned))).unwrap();
                })
                .unwrap();
            let (id, name) = rx.recv().unwrap();
            assert_eq!(id, h.id());
            assert_eq!(h.fiber().id(), id);
            assert_eq!(h.fiber().name(), Some("probe"));
            assert_eq!(name.as_deref(), Some("probe"));
            wait_until("the fiber to finish", 5, || h.is_finished());
            h.join().unwrap();
        })
    });
}

// ---------------------------------------------------------------- jobs

/// Kotlin's `withTimeout(Long.MAX_VALUE)`: runs the block to its value.
#[test]
fn with_timeout_max_runs_the_block() {
    within(10, || {
        rt1().block_on(|| {
            assert_eq!(fiber::with_timeout(Duration::MAX, || 5), Ok(5));
            let r = fiber::with_timeout(Duration::MAX, || fiber::sleep(ms(1)));
            assert_eq!(r, Ok(Ok(())));
        })
    });
}

// ---------------------------------------------------------------- net

fn kind<T>(r: std::io::Result<T>) -> Result<(), std::io::ErrorKind> {
    r.map(|_| ()).map_err(|e| e.kind())
}

/// std: a zero read or write timeout is `InvalidInput` on every socket
/// type; an unconnected UDP socket's `peer_addr` and `send` fail as std's.
#[test]
fn zero_timeouts_and_unconnected_udp_calls_fail_as_std_s() {
    use fiber::net::{
        unix::{UnixDatagram, UnixStream},
        UdpSocket,
    };
    within(10, || {
        rt1().block_on(|| {
            let su = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let fu = UdpSocket::bind("127.0.0.1:0").unwrap();
            assert_eq!(
                kind(fu.set_read_timeout(Some(Duration::ZERO))),
                kind(su.set_read_timeout(Some(Duration::ZERO)))
            );
            assert_eq!(
                kind(fu.set_write_timeout(Some(Duration::ZERO))),
                kind(su.set_write_timeout(Some(Duration::ZERO)))
            );
            assert_eq!(kind(fu.peer_addr()), kind(su.peer_addr()));
            assert_eq!(kind(fu.send(b"x")), kind(su.send(b"x")));
            let (fa, _fb) = UnixStream::pair().unwrap();
            let (sa, _sb) = std::os::unix::net::UnixStream::pair().unwrap();
            assert_eq!(
                kind(fa.set_read_timeout(Some(Duration::ZERO))),
                kind(sa.set_read_timeout(Some(Duration::ZERO)))
            );
            let fd = UnixDatagram::unbound().unwrap();
            let sd = std::os::unix::net::UnixDatagram::unbound().unwrap();
            assert_eq!(
                kind(fd.set_write_timeout(Some(Duration::ZERO))),
                kind(sd.set_write_timeout(Some(Duration::ZERO)))
            );
            assert_eq!(kind(fd.peer_addr()), kind(sd.peer_addr()));
            assert_eq!(kind(fd.send(b"x")), kind(sd.send(b"x")));
        })
    });
}

/// std: a listener set non-blocking fails `accept` with `WouldBlock`; set
/// back to blocking, `accept` waits for the connection (in a fiber too).
#[test]
fn a_nonblocking_listener_accepts_like_std_s() {
    within(10, || {
        rt2().block_on(|| {
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            assert_eq!(kind(l.accept()), Err(std::io::ErrorKind::WouldBlock));
            l.set_nonblocking(false).unwrap();
            let addr = l.local_addr().unwrap();
            let c = fiber::spawn(move || fiber::net::TcpStream::connect(addr).unwrap());
            let (s, peer) = l.accept().unwrap();
            let c = c.join().unwrap();
            assert_eq!(peer, c.local_addr().unwrap());
            assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
            assert_eq!(s.take_error().unwrap().map(|e| e.kind()), None);
            assert_eq!(l.take_error().unwrap().map(|e| e.kind()), None);
        })
    });
}

/// std's `connect` tries every address a name resolves to: "localhost"
/// may give `::1` first, where nothing listens; the IPv4 listener must
/// still be reached.
#[test]
fn connect_by_host_name_tries_every_address() {
    within(10, || {
        rt2().block_on(|| {
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let c = fiber::spawn(move || {
                fiber::net::TcpStream::connect(("localhost", port)).map(|s| s.peer_addr().unwrap())
            });
            let (_s, _) = l.accept().unwrap();
            assert_eq!(c.join().unwrap().unwrap().port(), port);
            let u = fiber::net::UdpSocket::bind("localhost:0").unwrap();
            assert!(u.local_addr().unwrap().ip().is_loopback());
        })
    });
}

/// std: after `shutdown(Write)` a write fails with `BrokenPipe`, the peer
/// reads end of file, and both addresses are still known.
#[test]
fn a_write_shutdown_keeps_addresses_and_fails_writes_like_std() {
    use std::io::{Read, Write};
    within(10, || {
        rt2().block_on(|| {
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let c = fiber::spawn(move || fiber::net::TcpStream::connect(addr).unwrap());
            let (mut s, _) = l.accept().unwrap();
            let mut c = c.join().unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
            assert_eq!(kind(c.write(b"x")), Err(std::io::ErrorKind::BrokenPipe));
            let mut buf = [0u8; 4];
            assert_eq!(s.read(&mut buf).unwrap(), 0);
            s.write_all(b"ok").unwrap();
            assert_eq!(c.read(&mut buf).unwrap(), 2);
            assert_eq!(c.peer_addr().unwrap(), addr);
            assert_eq!(c.local_addr().unwrap(), s.peer_addr().unwrap());
        })
    });
}

// ------------------------------------------------- auto traits and std items

// Auto-trait probes that compile either way (autoref specialization on a
// concrete type), so a missing impl is a failing assertion, not a build
// error that would take the whole file down.
struct Probe<T: ?Sized>(std::marker::PhantomData<T>);
trait HasSync {
    fn sync(&self) -> bool {
        true
    }
}
impl<T: ?Sized + Sync> HasSync for Probe<T> {}
trait NoSync {
    fn sync(&self) -> bool {
        false
    }
}
impl<T: ?Sized> NoSync for &Probe<T> {}
trait HasSend {
    fn send(&self) -> bool {
        true
    }
}
impl<T: ?Sized + Send> HasSend for Probe<T> {}
trait NoSend {
    fn send(&self) -> bool {
        false
    }
}
impl<T: ?Sized> NoSend for &Probe<T> {}
trait HasUnwindSafe {
    fn unwind_safe(&self) -> bool {
        true
    }
}
impl<T: ?Sized + std::panic::UnwindSafe + std::panic::RefUnwindSafe> HasUnwindSafe for Probe<T> {}
trait NoUnwindSafe {
    fn unwind_safe(&self) -> bool {
        false
    }
}
impl<T: ?Sized> NoUnwindSafe for &Probe<T> {}
macro_rules! probe {
    ($t:ty) => {
        (&Probe::<$t>(std::marker::PhantomData))
    };
}

/// tokio's `JoinError` is `Send + Sync` (its payload sits in a
/// `SyncWrapper`), so `handle.join()?` works in a function returning
/// `Box<dyn Error + Send + Sync>` or `anyhow::Result`, and
/// `io::Error::other(join_error)` compiles. fiber's `JoinError` implements
/// `Error` but holds a bare `Box<dyn Any + Send>`: it is `Send`, not
/// `Sync`, so none of those compile.
// Failed before the fix: fiber::JoinError is not Sync (Box<dyn Error + Send + Sync>::from(join_error), anyhow's `?` and io::Error::other do not compile)
#[test]
fn join_error_is_send_and_sync_like_tokio_s() {
    assert!(probe!(fiber::JoinError).send());
    assert!(probe!(fiber::JoinError).sync(), "fiber::JoinError is not Sync");
}

/// crossbeam-channel declares `unsafe impl Send for Select<'_>` and
/// `Sync` whatever the channels' element types. fiber's `Select` is
/// neither, on purpose (spec/chan.md, "Select"): it holds its channels'
/// handles with their element types erased, and a `Select` over a
/// `Receiver<Rc<_>>` moved to another thread would receive the `Rc` there.
/// The probes themselves can fail: `RefCell` is not `RefUnwindSafe`.
#[test]
fn select_stays_on_its_thread_and_the_probes_can_fail() {
    assert!(!probe!(chan::Select<'static>).send());
    assert!(!probe!(chan::Select<'static>).sync());
    assert!(!probe!(std::cell::RefCell<u8>).unwind_safe());
    assert!(!probe!(std::rc::Rc<u8>).send());
}

/// std's `RwLockReadGuard<T>` is `UnwindSafe + RefUnwindSafe` (as its
/// write guard and `MutexGuard` are, and as fiber's write guard and
/// `MutexGuard` are): `catch_unwind(|| *guard + 1)` compiles with std's.
// Failed before the fix: fiber::sync::RwLockReadGuard<u8> is neither UnwindSafe nor RefUnwindSafe (std's is both)
#[test]
fn a_read_guard_is_unwind_safe_like_std_s() {
    assert!(probe!(std::sync::RwLockReadGuard<'static, u8>).unwind_safe());
    assert!(probe!(fiber::sync::RwLockWriteGuard<'static, u8>).unwind_safe());
    assert!(probe!(fiber::sync::MutexGuard<'static, u8>).unwind_safe());
    assert!(
        probe!(fiber::sync::RwLockReadGuard<'static, u8>).unwind_safe(),
        "fiber's read guard is not unwind safe"
    );
}

/// The types that already match their std / crossbeam / tokio
/// counterparts (kept so that a fix of the ones above does not lose them).
#[test]
fn handles_channels_and_locks_have_their_counterparts_auto_traits() {
    assert!(probe!(fiber::JoinHandle<u8>).send() && probe!(fiber::JoinHandle<u8>).sync());
    assert!(probe!(fiber::ScopedJoinHandle<'static, u8>).send() && probe!(fiber::ScopedJoinHandle<'static, u8>).sync());
    assert!(probe!(chan::Sender<u8>).sync() && probe!(chan::Receiver<u8>).sync());
    assert!(probe!(fiber::Runtime).send() && probe!(fiber::Runtime).sync());
    assert!(probe!(fiber::Job).send() && probe!(fiber::Job).sync());
    assert!(!probe!(fiber::sync::MutexGuard<'static, u8>).send());
    assert!(probe!(fiber::sync::OnceLock<u8>).unwind_safe());
}

static LAZY: fiber::sync::LazyLock<u32> = fiber::sync::LazyLock::new(|| {
    // An initializer that waits the fiber way (a config read over a
    // socket, a channel receive): it parks its fiber.
    fiber::sleep(ms(20)).unwrap();
    7
});

/// `fiber::sync` claims `std::sync`'s shape ("a port is an import change"):
/// its `LazyLock` parks a second fiber that forces the value while the
/// first one's initializer is parked. (std's blocks the only worker of a
/// one-worker runtime there, for ever.)
// Failed before the fix: fiber::sync had no LazyLock (or Once), and std's hung here
#[test]
fn a_lazy_static_whose_initializer_parks_does_not_stall_the_runtime() {
    in_child(
        "a_lazy_static_whose_initializer_parks_does_not_stall_the_runtime",
        5,
        || {
            let rt = rt_fixed_grace(1, ms(100));
            let got = rt.block_on(|| {
                let first = fiber::spawn(|| *LAZY);
                let second = fiber::spawn(|| *LAZY);
                (first.join().unwrap(), second.join().unwrap())
            });
            assert_eq!(got, (7, 7));
        },
    );
}

// ---------------------------------------------------------------------------
// `fiber::sync::Once` and `LazyLock` against std's documented behaviour.

/// `Once::call_once` runs one closure; callers that arrive while it runs
/// (and parks) wait for it, on one worker, and see its effect.
#[test]
fn once_runs_one_closure_and_parks_the_callers_that_arrive_meanwhile() {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    static RUNS: AtomicU32 = AtomicU32::new(0);
    static ONCE: fiber::sync::Once = fiber::sync::Once::new();
    let got = within(20, || {
        rt1().block_on(|| {
            let callers: Vec<_> = (0..4)
                .map(|_| {
                    fiber::spawn(|| {
                        ONCE.call_once(|| {
                            fiber::sleep(ms(20)).unwrap();
                            RUNS.fetch_add(1, SeqCst);
                        });
                        RUNS.load(SeqCst)
                    })
                })
                .collect();
            callers.into_iter().map(|c| c.join().unwrap()).collect::<Vec<_>>()
        })
    });
    assert_eq!(got, vec![1, 1, 1, 1]);
    assert!(ONCE.is_completed());
}

/// std: a panicking closure poisons the `Once`: `call_once` and `wait`
/// then panic, `call_once_force` runs with `is_poisoned()` and, once it
/// returns, the `Once` is complete and later calls do nothing.
#[test]
fn a_panicking_closure_poisons_a_once_as_std_s_does() {
    let once = fiber::sync::Once::new();
    assert_eq!(
        panic_message(|| once.call_once(|| panic!("first"))).as_deref(),
        Some("first")
    );
    assert!(!once.is_completed());
    assert!(panic_message(|| once.call_once(|| {})).unwrap().contains("poisoned"));
    assert!(panic_message(|| once.wait()).unwrap().contains("poisoned"));
    let mut saw = None;
    once.call_once_force(|state| saw = Some(state.is_poisoned()));
    assert_eq!(saw, Some(true));
    assert!(once.is_completed());
    once.call_once(|| panic!("a completed Once runs nothing"));
    once.wait();
    once.wait_force();
}

/// A fiber parked in `Once::wait` while the closure runs wakes when it
/// panics, and panics itself (std: `wait` panics on a poisoned `Once`);
/// `wait_force` keeps waiting until a forced closure completes.
#[test]
fn a_waiter_of_a_once_whose_closure_panics_panics_and_a_forced_one_waits_on() {
    let got = within(20, || {
        rt1().block_on(|| {
            let once = std::sync::Arc::new(fiber::sync::Once::new());
            let (go_tx, go_rx) = chan::bounded::<()>(0);
            let runner = {
                let once = once.clone();
                fiber::spawn(move || {
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| {
                        once.call_once(|| {
                            go_rx.recv().unwrap();
                            panic!("closure");
                        })
                    }));
                })
            };
            fiber::yield_now().unwrap();
            let waiter = {
                let once = once.clone();
                fiber::spawn(move || panic_message(|| once.wait()))
            };
            let forced = {
                let once = once.clone();
                fiber::spawn(move || once.wait_force())
            };
            fiber::yield_now().unwrap();
            go_tx.send(()).unwrap();
            runner.join().unwrap();
            let waited = waiter.join().unwrap();
            assert!(!forced.is_finished());
            once.call_once_force(|state| assert!(state.is_poisoned()));
            forced.join().unwrap();
            waited
        })
    });
    assert!(got.unwrap().contains("poisoned"));
}

/// `call_once` from inside its own closure: std deadlocks; fiber panics
/// with a message that names the call.
#[test]
fn a_re_entrant_call_once_panics_naming_the_call() {
    let once = fiber::sync::Once::new();
    let message = panic_message(|| once.call_once(|| once.call_once(|| {}))).unwrap();
    assert!(message.contains("Once::call_once"), "{message}");
}

/// std: a `LazyLock` whose initializer panicked is poisoned: every later
/// access panics, also from another fiber; `into_inner` gives the value
/// or the initializer back.
#[test]
fn a_lazy_lock_is_poisoned_by_a_panicking_initializer_and_gives_back_its_parts() {
    let lazy: fiber::sync::LazyLock<u32> = fiber::sync::LazyLock::new(|| panic!("init"));
    assert_eq!(panic_message(|| assert_eq!(*lazy, 0)).as_deref(), Some("init"));
    let message = panic_message(|| assert_eq!(*fiber::sync::LazyLock::force(&lazy), 0)).unwrap();
    assert!(message.contains("poisoned"), "{message}");
    let lazy = std::sync::Arc::new(lazy);
    let from_fiber = within(20, move || {
        rt1().block_on(move || {
            fiber::spawn(move || std::panic::catch_unwind(AssertUnwindSafe(|| assert_eq!(**lazy, 0))).is_err())
                .join()
                .unwrap()
        })
    });
    assert!(from_fiber);

    let made = fiber::sync::LazyLock::new(|| String::from("made"));
    assert_eq!(format!("{made:?}"), "LazyLock(<uninit>)");
    assert_eq!(made.len(), 4);
    assert_eq!(format!("{made:?}"), "LazyLock(\"made\")");
    assert_eq!(fiber::sync::LazyLock::into_inner(made).ok().as_deref(), Some("made"));
    let unmade = fiber::sync::LazyLock::new(|| 5u8);
    let Err(f) = fiber::sync::LazyLock::into_inner(unmade) else {
        panic!("an unforced LazyLock gives its initializer back")
    };
    assert_eq!(f(), 5);
}

/// `h.join()?` in a function returning `Box<dyn Error + Send + Sync>` or
/// `io::Result` (tokio's `JoinError` allows both); the message survives,
/// and a payload that is not a string still comes back by value.
#[test]
fn a_join_error_converts_into_boxed_sync_errors_and_io_errors() {
    fn boxed(h: fiber::JoinHandle<u8>) -> Result<u8, Box<dyn std::error::Error + Send + Sync>> {
        Ok(h.join()?)
    }
    fn io(h: fiber::JoinHandle<u8>) -> std::io::Result<u8> {
        Ok(h.join()?)
    }
    let (b, i, custom) = within(20, || {
        rt1().block_on(|| {
            let b = boxed(fiber::spawn(|| panic!("boom"))).unwrap_err().to_string();
            let i = io(fiber::spawn(|| panic!("bang"))).unwrap_err();
            let err = fiber::spawn(|| -> u8 { std::panic::panic_any(41u32) })
                .join()
                .unwrap_err();
            // As std's `Box<dyn Any + Send>`: any `Sync` payload type by
            // reference (it was `None` for a payload other than a string).
            assert!(err.is_panic() && err.panic_payload().is_none());
            assert_eq!(err.downcast_ref::<u32>(), Some(&41));
            let custom = *err.into_panic().downcast::<u32>().unwrap() + 1;
            (b, i, custom)
        })
    });
    assert!(b.contains("panicked with message \"boom\""), "{b}");
    assert_eq!(i.kind(), std::io::ErrorKind::Other);
    assert!(i.to_string().contains("\"bang\""), "{i}");
    assert_eq!(custom, 42);
}

/// std's `ScopedJoinHandle::thread().unpark()`: the scoped handle's
/// `fiber()` names the child and unparks it.
#[test]
fn a_scoped_handle_s_fiber_unparks_the_child() {
    let (name, woke) = within(20, || {
        rt1().block_on(|| {
            let parked = std::sync::atomic::AtomicBool::new(false);
            fiber::scope(|s| {
                let h = fiber::Builder::new()
                    .name("child".to_string())
                    .spawn_scoped(s, || {
                        parked.store(true, std::sync::atomic::Ordering::SeqCst);
                        fiber::park();
                        fiber::current().name().map(str::to_owned)
                    })
                    .unwrap();
                while !parked.load(std::sync::atomic::Ordering::SeqCst) {
                    fiber::yield_now().unwrap();
                }
                let child = h.fiber();
                assert_eq!(child.id(), h.id());
                child.unpark();
                (child.name().map(str::to_owned), h.join().unwrap())
            })
        })
    });
    assert_eq!(name.as_deref(), Some("child"));
    assert_eq!(woke.as_deref(), Some("child"));
}

/// std's `&thread::Scope` is `UnwindSafe` (its `Scope` is
/// `RefUnwindSafe`): a closure that spawns from a borrowed scope passes
/// `catch_unwind` without `AssertUnwindSafe`.
#[test]
fn a_borrowed_scope_is_unwind_safe_like_std_s() {
    assert!(probe!(&'static std::thread::Scope<'static, 'static>).unwind_safe());
    assert!(probe!(&'static fiber::Scope<'static, 'static>).unwind_safe());
    let got = within(20, || {
        rt1().block_on(|| fiber::scope(|s| std::panic::catch_unwind(|| s.spawn(|| 6).join().unwrap() + 1).unwrap()))
    });
    assert_eq!(got, 7);
}
