//! Adversarial review 49: a soundness audit of the public API. Covers the
//! auto traits of every public type against std's and crossbeam's (positive
//! checks by bound, negative ones by the "ambiguous impl" trick), zero-sized
//! and over-aligned (`align(4096)`) values through channels, join slots,
//! scoped outcomes, fiber-locals and `fiber::sync` cells, `mem::forget` of
//! scoped handles and guards, panics in user code at points where the
//! runtime holds state (a value's `Drop` during a channel's disconnect, a
//! scope body that panics while a child borrows its stack, a user
//! `CancelScope` whose `is_cancelled` panics inside a wait), re-entrant
//! destructors, payloads that are not `Sync` in a `JoinError`, and pinned
//! fibers keeping `thread_local!` references across parks.

use crate::common::*;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Fails to compile if `$t` implements `$tr` (the `static_assertions`
/// crate's `assert_not_impl_any!` trick: with the impl, the call below is
/// ambiguous between the two blanket impls).
macro_rules! assert_not_impl {
    ($t:ty: $tr:path) => {{
        trait AmbiguousIfImpl<A> {
            fn some_item() {}
        }
        impl<T: ?Sized> AmbiguousIfImpl<()> for T {}
        #[allow(dead_code)]
        struct Invalid;
        impl<T: ?Sized + $tr> AmbiguousIfImpl<Invalid> for T {}
        let _ = <$t as AmbiguousIfImpl<_>>::some_item;
    }};
}

fn send<T: Send + ?Sized>() {}
fn sync<T: Sync + ?Sized>() {}
fn send_sync<T: Send + Sync + ?Sized>() {}

/// The positive half: what std and crossbeam promise, this crate promises
/// too.
#[test]
fn public_types_have_the_auto_traits_std_and_crossbeam_give() {
    use fiber::chan::{IntoIter, Iter, Receiver, Sender, TryIter};
    use fiber::sync::*;
    // crossbeam: `Sender<T>` / `Receiver<T>` are `Send + Sync` for `T: Send`.
    send_sync::<Sender<Cell<u8>>>();
    send_sync::<Receiver<Cell<u8>>>();
    send_sync::<Iter<'static, Cell<u8>>>();
    send_sync::<TryIter<'static, Cell<u8>>>();
    send_sync::<IntoIter<Cell<u8>>>();
    // std: `Mutex<T>` is `Sync` for `T: Send` (a `Cell` may be locked).
    send_sync::<Mutex<Cell<u8>>>();
    send_sync::<Mutex<[u8]>>();
    send::<RwLock<Cell<u8>>>();
    send_sync::<RwLock<Vec<u8>>>();
    sync::<MutexGuard<'static, u8>>();
    sync::<RwLockReadGuard<'static, u8>>();
    sync::<RwLockWriteGuard<'static, u8>>();
    send::<OnceLock<Cell<u8>>>();
    send_sync::<OnceLock<u8>>();
    send::<LazyLock<Cell<u8>>>();
    send_sync::<LazyLock<u8>>();
    send_sync::<Once>();
    send_sync::<Condvar>();
    send_sync::<Barrier>();
    send_sync::<Semaphore>();
    send_sync::<SemaphorePermit<'static>>();
    send_sync::<WaitGroup>();
    // std's `JoinHandle<T>` is `Send + Sync` for any `T`; here `T: Send`
    // (the only ones `spawn` makes), and `&JoinHandle` lends no `&T`.
    send_sync::<fiber::JoinHandle<Cell<u8>>>();
    send_sync::<fiber::JoinError>();
    send_sync::<fiber::Scope<'static, 'static>>();
    send_sync::<fiber::TryScope<'static, 'static, Cell<u8>>>();
    send_sync::<fiber::ScopedJoinHandle<'static, u8>>();
    send_sync::<fiber::Job>();
    send_sync::<fiber::FiberHandle>();
    send_sync::<fiber::Runtime>();
    send_sync::<fiber::Handle>();
    sync::<fiber::FiberLocal<Cell<u8>>>();
    send_sync::<fiber::net::TcpStream>();
    send_sync::<fiber::net::TcpListener>();
    send_sync::<fiber::net::UdpSocket>();
    send_sync::<fiber::net::unix::UnixStream>();
    send_sync::<fiber::net::unix::UnixDatagram>();
}

/// The negative half: guards are not `Send` (as std's), `!Send` or
/// `!Sync` payloads make their containers so, a select and its selected
/// operation stay on their thread (as crossbeam's). Each line fails to
/// compile if the trait is implemented.
#[test]
fn public_types_lack_the_auto_traits_std_and_crossbeam_withhold() {
    use fiber::chan::{Receiver, Select, SelectedOperation, SendError, Sender};
    use fiber::sync::*;
    type StdGuard = std::sync::MutexGuard<'static, u8>;
    assert_not_impl!(MutexGuard<'static, u8>: Send);
    assert_not_impl!(MutexGuard<'static, Cell<u8>>: Sync);
    assert_not_impl!(RwLockReadGuard<'static, u8>: Send);
    assert_not_impl!(RwLockReadGuard<'static, Cell<u8>>: Sync);
    assert_not_impl!(RwLockWriteGuard<'static, u8>: Send);
    assert_not_impl!(RwLockWriteGuard<'static, Cell<u8>>: Sync);
    assert_not_impl!(Mutex<Rc<u8>>: Send);
    assert_not_impl!(Mutex<Rc<u8>>: Sync);
    assert_not_impl!(Mutex<StdGuard>: Sync);
    assert_not_impl!(RwLock<Cell<u8>>: Sync);
    assert_not_impl!(RwLock<StdGuard>: Send);
    assert_not_impl!(OnceLock<Cell<u8>>: Sync);
    assert_not_impl!(OnceLock<StdGuard>: Send);
    assert_not_impl!(LazyLock<Cell<u8>>: Sync);
    assert_not_impl!(LazyLock<StdGuard>: Sync);
    assert_not_impl!(LazyLock<u8, Box<dyn FnOnce() -> u8>>: Send);
    assert_not_impl!(LazyLock<u8, Box<dyn FnOnce() -> u8>>: Sync);
    assert_not_impl!(Sender<Rc<u8>>: Send);
    assert_not_impl!(Sender<Rc<u8>>: Sync);
    assert_not_impl!(Receiver<Rc<u8>>: Send);
    assert_not_impl!(Receiver<Rc<u8>>: Sync);
    assert_not_impl!(SendError<Rc<u8>>: Send);
    assert_not_impl!(Select<'static>: Send);
    assert_not_impl!(Select<'static>: Sync);
    assert_not_impl!(SelectedOperation<'static, 'static>: Send);
    assert_not_impl!(fiber::JoinHandle<Rc<u8>>: Send);
    assert_not_impl!(fiber::JoinHandle<Rc<u8>>: Sync);
    assert_not_impl!(fiber::TryScope<'static, 'static, Rc<u8>>: Send);
    assert_not_impl!(fiber::TryScope<'static, 'static, Rc<u8>>: Sync);
}

/// A page-aligned value: every place that stores a message, an outcome or
/// a local must honour its alignment (a misaligned reference is UB).
#[repr(align(4096))]
#[derive(Clone, Debug, PartialEq)]
struct Page([u64; 3]);

impl Page {
    fn new(n: u64) -> Page {
        Page([n, n.wrapping_mul(31), !n])
    }
    fn aligned(&self) -> bool {
        (self as *const Page as usize) % 4096 == 0
    }
    fn ok(&self, n: u64) -> bool {
        self.aligned() && *self == Page::new(n)
    }
}

fiber::fiber_local! {
    static PAGE_LOCAL: Page = Page::new(77);
}

#[test]
fn over_aligned_values_keep_their_alignment_everywhere() {
    on_runtime(|| {
        // Channels: rendezvous, bounded ring, unbounded, across fibers.
        for cap in [None, Some(0), Some(1), Some(3)] {
            let (tx, rx) = match cap {
                None => fiber::chan::unbounded::<Page>(),
                Some(c) => fiber::chan::bounded::<Page>(c),
            };
            let producer = fiber::spawn(move || {
                for n in 0..20 {
                    tx.send(Page::new(n)).unwrap();
                }
            });
            for n in 0..20 {
                let got = rx.recv().unwrap();
                assert!(got.ok(n), "channel {cap:?} gave {got:?} at {:p}", &got);
            }
            producer.join().unwrap();
        }
        // A join slot, and a scoped child's outcome.
        let got = fiber::spawn(|| Page::new(5)).join().unwrap();
        assert!(got.ok(5));
        let (a, b) = fiber::scope(|s| {
            let h1 = s.spawn(|| Page::new(6));
            let h2 = s.spawn(|| (Page::new(7), 1u8));
            (h1.join().unwrap(), h2.join().unwrap())
        });
        assert!(a.ok(6) && b.0.ok(7));
        // Fiber-locals (boxed per value) and the sync cells.
        let local = fiber::spawn(|| PAGE_LOCAL.with(|p| p.ok(77))).join().unwrap();
        assert!(local);
        let cell = fiber::sync::OnceLock::new();
        assert!(cell.get_or_init(|| Page::new(8)).ok(8));
        let lazy = fiber::sync::LazyLock::new(|| Page::new(9));
        assert!(lazy.ok(9));
        let m = fiber::sync::Mutex::new(Page::new(10));
        assert!(m.lock().unwrap().ok(10));
        let l = fiber::sync::RwLock::new(Page::new(11));
        assert!(l.read().unwrap().ok(11));
    });
}

static ZST_DROPS: AtomicUsize = AtomicUsize::new(0);

/// A zero-sized value that counts its drops.
struct Zst;

impl Drop for Zst {
    fn drop(&mut self) {
        ZST_DROPS.fetch_add(1, Ordering::SeqCst);
    }
}

/// Zero-sized values are dropped exactly once wherever they go: taken by a
/// receiver, left in a closed channel's buffer, a join slot never joined,
/// a scoped outcome whose handle is dropped.
#[test]
fn zero_sized_values_are_dropped_exactly_once() {
    on_runtime(|| {
        let before = ZST_DROPS.load(Ordering::SeqCst);
        for cap in [None, Some(1), Some(8)] {
            let (tx, rx) = match cap {
                None => fiber::chan::unbounded::<Zst>(),
                Some(c) => fiber::chan::bounded::<Zst>(c),
            };
            for _ in 0..cap.unwrap_or(8) {
                tx.send(Zst).unwrap();
            }
            drop(rx.recv().unwrap());
            drop(rx);
            // The rest is dropped by the disconnect; a late send gets its
            // value back.
            let back = tx.send(Zst).unwrap_err();
            drop(back);
        }
        // Each channel: every value sent, and the late one given back.
        let expected = (8 + 1) + (1 + 1) + (8 + 1);
        assert_eq!(ZST_DROPS.load(Ordering::SeqCst) - before, expected);
        let before = ZST_DROPS.load(Ordering::SeqCst);
        drop(fiber::spawn(|| Zst));
        let joined = fiber::spawn(|| Zst);
        drop(joined.join().unwrap());
        fiber::scope(|s| {
            drop(s.spawn(|| Zst));
            let h = s.spawn(|| Zst);
            wait_until("the child to end", 10, || h.is_finished());
            drop(h);
        });
        wait_until("the detached fiber's value to drop", 10, || {
            ZST_DROPS.load(Ordering::SeqCst) - before == 4
        });
    });
}

/// What a scoped child returns borrows the scope owner's stack and reads
/// it when dropped. A handle that is forgotten leaks the value: it must
/// never be dropped later (after the scope returned, its borrow dangles).
struct ReadsOnDrop<'a> {
    borrowed: &'a AtomicBool,
    dropped_late: Arc<AtomicBool>,
}

impl Drop for ReadsOnDrop<'_> {
    fn drop(&mut self) {
        if self.borrowed.load(Ordering::SeqCst) {
            self.dropped_late.store(true, Ordering::SeqCst);
        }
    }
}

#[test]
fn a_forgotten_scoped_handle_leaks_its_outcome_and_never_drops_it_after_the_scope() {
    on_runtime(|| {
        let dropped_late = Arc::new(AtomicBool::new(false));
        for _ in 0..20 {
            let scope_over = Box::new(AtomicBool::new(false));
            let late = dropped_late.clone();
            fiber::scope(|s| {
                let borrowed: &AtomicBool = &scope_over;
                let h = s.spawn(move || ReadsOnDrop {
                    borrowed,
                    dropped_late: late,
                });
                std::mem::forget(h);
            });
            scope_over.store(true, Ordering::SeqCst);
            // The job and its slot go with the next sweeps and scopes.
            fiber::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| ());
                }
            });
            // Poison the box's memory before it is freed: a late drop
            // would read `true` or freed memory.
            drop(scope_over);
        }
        let _ = fiber::sleep(ms(20));
        assert!(
            !dropped_late.load(Ordering::SeqCst),
            "a forgotten handle's outcome was dropped after its scope returned"
        );
    });
}

/// The scope body panics while children still run on borrows of its
/// stack: the scope waits for every child before the panic leaves it.
#[test]
fn a_panicking_scope_body_waits_for_children_that_borrow_its_stack() {
    on_runtime(|| {
        let finished_after = Arc::new(AtomicBool::new(false));
        let owner_gone = Arc::new(AtomicBool::new(false));
        let (f, g) = (finished_after.clone(), owner_gone.clone());
        let msg = panic_message(move || {
            let data = vec![1u64; 64];
            fiber::scope(|s| {
                for i in 0..4 {
                    let (data, f, g) = (&data, f.clone(), g.clone());
                    s.spawn(move || {
                        // Not cancellation-aware: keeps reading the borrow.
                        fiber::non_cancellable(|| {
                            let _ = fiber::sleep(ms(5 * (i + 1)));
                        });
                        assert_eq!(data.iter().sum::<u64>(), 64);
                        if g.load(Ordering::SeqCst) {
                            f.store(true, Ordering::SeqCst);
                        }
                    });
                }
                panic!("body gives up");
            });
        });
        owner_gone.store(true, Ordering::SeqCst);
        assert_eq!(msg.as_deref(), Some("body gives up"));
        let _ = fiber::sleep(ms(40));
        assert!(!finished_after.load(Ordering::SeqCst));
    });
}

/// A buffered value whose `Drop` sends on the same channel and drops a
/// clone of its receiver: the disconnect drops it outside the channel's
/// lock, so the re-entrant send fails cleanly instead of deadlocking on a
/// lock that is not re-entrant, and a second panicking `Drop` does not
/// stop the rest from being dropped.
struct Reenters {
    tx: fiber::chan::Sender<Reenters>,
    panics: bool,
    dropped: Arc<AtomicUsize>,
}

impl Drop for Reenters {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
        // Disconnected: the value comes back and is forgotten (dropping it
        // would recurse for ever).
        let probe = Reenters {
            tx: self.tx.clone(),
            panics: false,
            dropped: Arc::new(AtomicUsize::new(0)),
        };
        if let Err(back) = self.tx.send(probe) {
            std::mem::forget(back.0);
        }
        if self.panics {
            panic!("drop of a buffered value");
        }
    }
}

#[test]
fn a_buffered_values_drop_may_reenter_its_channel_during_disconnect() {
    within(30, || {
        for cap in [None, Some(4)] {
            let (tx, rx) = match cap {
                None => fiber::chan::unbounded(),
                Some(c) => fiber::chan::bounded(c),
            };
            let dropped = Arc::new(AtomicUsize::new(0));
            for i in 0..4 {
                tx.send(Reenters {
                    tx: tx.clone(),
                    panics: i % 2 == 1,
                    dropped: dropped.clone(),
                })
                .unwrap();
            }
            drop(tx);
            let msg = panic_message(move || drop(rx));
            assert_eq!(msg.as_deref(), Some("drop of a buffered value"));
            assert_eq!(dropped.load(Ordering::SeqCst), 4, "{cap:?}");
        }
    });
}

/// A panic payload that is not `Sync` never becomes reachable by `&` from
/// a `JoinError` (which is `Sync`): only by value.
#[test]
fn a_non_sync_panic_payload_is_only_handed_out_by_value() {
    on_runtime(|| {
        let h = fiber::spawn(|| std::panic::panic_any(Cell::new(41u32)));
        let err = h.join().unwrap_err();
        assert!(err.is_panic());
        assert!(err.panic_payload().is_none());
        // (`err.downcast_ref::<Cell<u32>>()` does not compile: a shared
        // reference needs a `Sync` payload type.)
        let shared = Arc::new(err);
        let s2 = shared.clone();
        let text = std::thread::spawn(move || format!("{s2} {s2:?}")).join().unwrap();
        assert!(text.contains("panicked"), "{text}");
        let err = Arc::try_unwrap(shared).unwrap();
        let payload = err.into_panic();
        assert_eq!(payload.downcast::<Cell<u32>>().unwrap().get(), 41);
    });
}

thread_local! {
    static TLS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// The README's answer to `thread_local!` references across parks: a
/// pinned fiber resumes only on its worker, so a reference into its
/// thread-local stays on the thread that owns it (an unpinned fiber may
/// move after any park; the README documents that caveat, the type system
/// does not prevent it).
#[test]
fn a_pinned_fibers_thread_local_reference_stays_on_its_thread_across_parks() {
    within(30, || {
        let rt = rt2();
        let moved = rt.block_on(|| {
            let hs: Vec<_> = (0..8)
                .map(|_| {
                    fiber::spawn_pinned(|| {
                        let home = std::thread::current().id();
                        TLS.with(|cell| {
                            let mut moved = 0;
                            for i in 0..20 {
                                cell.borrow_mut().push(i);
                                let _ = fiber::sleep(ms(1));
                                let _ = fiber::yield_now();
                                if std::thread::current().id() != home {
                                    moved += 1;
                                }
                            }
                            moved
                        })
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<u32>()
        });
        assert_eq!(moved, 0);
    });
}

/// A user `CancelScope` (public: `fiber::core::swap_cancel_scope`) whose
/// `is_cancelled` panics once, inside a wait: `enter_parking` calls it with
/// the fiber already PARKING and has no guard that puts it back to
/// RUNNING, so the fiber runs on in PARKING. With the lifecycle checks on
/// (`spec-assert`, debug builds) its next wait or its end panics on a
/// worker thread outside any fiber and the worker dies; without them the
/// state word is silently wrong.
struct PanicsOnce(AtomicBool);

impl fiber::core::CancelScope for PanicsOnce {
    fn is_cancelled(&self) -> bool {
        if !self.0.swap(true, Ordering::SeqCst) {
            panic!("is_cancelled panics");
        }
        false
    }
}

// Failed before the fix: a panicking CancelScope::is_cancelled leaves its fiber PARKING (wait.rs enter_parking has no guard); with checks on the worker dies and the runtime hangs
#[test]
fn a_cancel_scope_that_panics_in_a_wait_leaves_the_fiber_legal() {
    in_child(
        "a_cancel_scope_that_panics_in_a_wait_leaves_the_fiber_legal",
        20,
        || {
            within(10, || {
                let rt = rt2();
                let total = rt.block_on(|| {
                    let hs: Vec<_> = (0..8u64)
                        .map(|i| {
                            fiber::spawn(move || {
                                let previous =
                                    fiber::core::swap_cancel_scope(Some(Arc::new(PanicsOnce(AtomicBool::new(false)))));
                                let r = std::panic::catch_unwind(|| fiber::sleep(ms(1)));
                                assert!(r.is_err());
                                for _ in 0..3 {
                                    let _ = fiber::sleep(ms(1));
                                }
                                fiber::core::swap_cancel_scope(previous);
                                i
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).sum::<u64>()
                });
                assert_eq!(total, 28);
            });
        },
    );
}

/// A user `CancelScope` whose `is_cancelled` always panics: the body's
/// wait raises it (caught at the fiber boundary), but `try_spawn_with`'s
/// body asks the scope again after the closure, outside any
/// `catch_unwind` (task.rs, `cancel_seen`), so the panic leaves the
/// coroutine, unwinds the worker thread and kills it. Every worker dies
/// this way and the runtime hangs; the join never returns.
struct AlwaysPanics;

impl fiber::core::CancelScope for AlwaysPanics {
    fn is_cancelled(&self) -> bool {
        panic!("is_cancelled always panics")
    }
}

// Failed before the fix: a CancelScope::is_cancelled that panics escapes the fiber body (task.rs cancel_seen) and kills the worker thread; the join hangs
#[test]
fn a_cancel_scope_that_always_panics_fails_only_its_own_fiber() {
    in_child("a_cancel_scope_that_always_panics_fails_only_its_own_fiber", 20, || {
        within(10, || {
            let rt = rt2();
            let failed = rt.block_on(|| {
                let hs: Vec<_> = (0..4)
                    .map(|_| {
                        fiber::spawn(|| {
                            let _previous = fiber::core::swap_cancel_scope(Some(Arc::new(AlwaysPanics)));
                            let _ = fiber::sleep(ms(1));
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().is_err()).filter(|e| *e).count()
            });
            assert_eq!(failed, 4);
        });
    });
}
