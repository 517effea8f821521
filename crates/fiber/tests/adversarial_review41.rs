//! Adversarial review 41: resources. Long loops of each timed or
//! cancellable operation, bursts, and runtimes built and dropped, checking
//! that what they use (memory, timer entries, frames, threads, descriptors,
//! job and fiber counters) stays bounded and that every value is dropped
//! exactly once.
//!
//! Process-wide measurements (RSS, threads, descriptors, maps) run in a
//! child process (`common::in_child`), one heavy child at a time.

mod common;
use common::*;

use fiber::chan;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// One heavy child at a time (each measures the whole process).
fn heavy(scenario: &str, secs: u64, body: impl FnOnce()) {
    let _one = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    in_child(scenario, secs, body);
}

/// This process's resident set (`VmRSS`), in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn maps_count() -> usize {
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().count()
}

/// A value that counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// On a plain thread: poll `cond` every 5 ms for up to `secs`.
fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            return false;
        }
        std::thread::sleep(ms(5));
    }
}

// ---------------------------------------------------------------------------
// Channels
// ---------------------------------------------------------------------------

/// crossbeam's unbounded channel frees each block of 31 slots once it is
/// read: a long-lived channel that once buffered a burst keeps nothing of
/// it. Here 100,000 values of 512 bytes (about 50 MiB) go through one
/// channel that stays open afterwards; once they are all received the
/// memory of the burst must go back (RSS back within 16 MiB of where it
/// started), as it does when the channel is dropped.
// Failed before the fix: an unbounded channel's VecDeque buffer never shrinks: a drained channel keeps a burst's memory until dropped
#[test]
fn a_drained_unbounded_channel_gives_the_memory_of_a_burst_back() {
    heavy(
        "a_drained_unbounded_channel_gives_the_memory_of_a_burst_back",
        60,
        || {
            let rt = rt2();
            rt.block_on(|| {
                const N: usize = 100_000;
                let (tx, rx) = chan::unbounded::<[u8; 512]>();
                let base = rss_kib();
                for i in 0..N {
                    tx.send([i as u8; 512]).unwrap();
                }
                let full = rss_kib();
                for i in 0..N {
                    assert_eq!(rx.try_recv().unwrap()[0], i as u8);
                }
                assert!(rx.is_empty());
                let drained = rss_kib();
                drop((tx, rx));
                let dropped = rss_kib();
                eprintln!("rss KiB: base {base}, full {full}, drained {drained}, dropped {dropped}");
                assert!(full > base + 40 * 1024, "the burst did not show in RSS");
                assert!(
                    drained < base + 16 * 1024,
                    "a drained unbounded channel still holds the burst's memory: RSS {drained} KiB against \
                 {base} KiB before the burst ({dropped} KiB once the channel is dropped)"
                );
            });
        },
    );
}

/// Values buffered in a bounded channel, values held by parked senders of
/// a full one and values in a rendezvous hand-off all drop exactly once
/// when the last receiver goes: buffered ones with the channel, the
/// senders' ones given back in their `SendError`.
#[test]
fn values_buffered_and_held_by_parked_senders_drop_exactly_once() {
    on_runtime(|| {
        for cap in [0usize, 1, 8] {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, rx) = chan::bounded::<Counted>(cap);
            for _ in 0..cap {
                tx.send(Counted(drops.clone())).unwrap();
            }
            let senders: Vec<_> = (0..16)
                .map(|_| {
                    let tx = tx.clone();
                    let d = drops.clone();
                    fiber::spawn(move || tx.send(Counted(d)).map_err(|e| e.into_inner()))
                })
                .collect();
            wait_until("senders to park", 10, || {
                fiber::dump()
                    .fibers
                    .iter()
                    .filter(|f| f.state == fiber::core::state::FiberState::Parked)
                    .count()
                    >= 16
            });
            assert_eq!(drops.load(SeqCst), 0);
            drop(rx);
            assert_eq!(
                drops.load(SeqCst),
                cap,
                "buffered values not dropped with the channel (cap {cap})"
            );
            let mut given_back = 0;
            for s in senders {
                let v = s.join().unwrap().unwrap_err();
                given_back += 1;
                drop(v);
            }
            assert_eq!(given_back, 16);
            drop(tx);
            assert_eq!(drops.load(SeqCst), cap + 16, "cap {cap}");
        }
    });
}

/// 20,000 rounds of a rendezvous send racing a cancellation of the
/// receiver parked for it: each value is received or given back to its
/// sender, and dropped exactly once either way.
#[test]
fn rendezvous_hand_offs_racing_a_receivers_cancel_drop_each_value_once() {
    within(60, || {
        rt2().block_on(|| {
            const N: usize = 20_000;
            let drops = Arc::new(AtomicUsize::new(0));
            let (mut received, mut returned) = (0, 0);
            for _ in 0..N {
                let (tx, rx) = chan::bounded::<Counted>(0);
                let receiver = fiber::spawn(move || rx.recv().ok());
                let d = drops.clone();
                let sender = fiber::spawn(move || tx.send_timeout(Counted(d), ms(50)).map_err(|e| e.into_inner()));
                receiver.cancel();
                if let Ok(Some(v)) = receiver.join() {
                    received += 1;
                    drop(v);
                }
                if let Ok(Err(v)) = sender.join() {
                    returned += 1;
                    drop(v);
                }
            }
            assert_eq!(drops.load(SeqCst), N, "{received} received, {returned} given back");
            wait_until("the fibers to end", 10, || fiber::stats().runtime.fibers_alive == 1);
        });
    });
}

/// `send_timeout` on a full channel timing out 50,000 times: each value
/// comes back once in the error, timer entries stay bounded.
#[test]
fn send_timeouts_that_expire_give_every_value_back_and_leave_few_timers() {
    within(60, || {
        rt2().block_on(|| {
            let drops = Arc::new(AtomicUsize::new(0));
            let (tx, _rx) = chan::bounded::<Counted>(1);
            tx.send(Counted(drops.clone())).unwrap();
            let mut max_pending = 0;
            for i in 0..2_000 {
                let err = tx
                    .send_timeout(Counted(drops.clone()), Duration::from_micros(1))
                    .unwrap_err();
                assert!(err.is_timeout());
                drop(err);
                assert_eq!(drops.load(SeqCst), i + 1);
                max_pending = max_pending.max(fiber::stats().runtime.timers_pending);
            }
            assert!(max_pending <= 4_096, "{max_pending} timers pending");
        });
    });
}

/// `select!` with a `default(1h)` arm whose channel arm is always ready
/// at once, 100,000 times: the select's deadline timers do not pile up.
#[test]
fn selects_with_a_long_default_timeout_that_never_fires_leave_few_timers() {
    within(60, || {
        rt2().block_on(|| {
            let (tx, rx) = chan::bounded::<u64>(1);
            let (_keep, never) = chan::bounded::<()>(0);
            let mut max_pending = 0;
            let server = fiber::spawn(move || {
                for i in 0..50_000u64 {
                    tx.send(i).unwrap();
                }
            });
            for i in 0..50_000u64 {
                fiber::select! {
                    recv(rx) -> v => assert_eq!(v, Ok(i)),
                    recv(never) -> _ => unreachable!(),
                    default(Duration::from_secs(3600)) => panic!("timed out"),
                }
                if i % 64 == 0 {
                    max_pending = max_pending.max(fiber::stats().runtime.timers_pending);
                }
            }
            server.join().unwrap();
            assert!(max_pending <= 4_096, "{max_pending} timers pending");
        });
    });
}

// ---------------------------------------------------------------------------
// Scheduler counters
// ---------------------------------------------------------------------------

/// After a churn of every kind of wake (spawn and join, yields, pinned
/// fibers, blocking calls, timers, cancels, channel ping-pong, joins from
/// plain threads), once only the root is left and parked the counters read
/// as such: nothing runnable, one fiber alive, the pressure back at zero.
#[test]
fn counters_do_not_drift_after_a_churn_of_every_kind_of_wake() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(4)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let handle = rt.handle();
        let outside = std::thread::spawn(move || {
            for i in 0..500u64 {
                assert_eq!(handle.spawn(move || i * 2).join().unwrap(), i * 2);
            }
        });
        rt.block_on(|| {
            for round in 0..20u64 {
                let (tx, rx) = chan::bounded::<u64>(0);
                let pong = fiber::spawn(move || rx.iter().sum::<u64>());
                let mut hs = Vec::new();
                for i in 0..50u64 {
                    let tx = tx.clone();
                    hs.push(fiber::spawn(move || {
                        fiber::yield_now().unwrap();
                        tx.send(i).unwrap();
                        i
                    }));
                    hs.push(fiber::spawn_pinned(move || {
                        fiber::yield_now().unwrap();
                        fiber::sleep(Duration::from_micros(100)).unwrap();
                        i
                    }));
                    hs.push(fiber::spawn(move || fiber::blocking(move || i)));
                    let sleeper = fiber::spawn(move || {
                        let _ = fiber::sleep(Duration::from_secs(60));
                        i
                    });
                    sleeper.cancel();
                    hs.push(sleeper);
                }
                drop(tx);
                for h in hs {
                    let _ = h.join();
                }
                assert_eq!(pong.join().unwrap(), (0..50).sum::<u64>(), "round {round}");
            }
        });
        outside.join().unwrap();
        rt.block_on(|| {
            wait_until("the counters to settle", 10, || {
                let s = fiber::stats().runtime;
                s.fibers_alive == 1 && s.fibers_runnable == 0
            });
        });
        // From outside, with no fiber at all.
        assert!(
            eventually(10, || {
                let s = rt.stats();
                s.fibers_alive == 0 && s.fibers_runnable == 0 && s.fibers_parked == 0
            }),
            "counters drifted: {}",
            rt.stats()
        );
    });
}

/// 50,000 fibers cancelled before they ever ran: each closure is dropped
/// exactly once (inside its fiber), the handles report `Cancelled`, and
/// the frames are reused (frames allocated stay far below the count).
#[test]
fn fibers_cancelled_before_they_run_drop_their_closures_once_and_reuse_frames() {
    within(60, || {
        let rt = rt1();
        rt.block_on(|| {
            let drops = Arc::new(AtomicUsize::new(0));
            const N: usize = 20_000;
            for chunk in 0..(N / 100) {
                let hs: Vec<_> = (0..100)
                    .map(|_| {
                        let c = Counted(drops.clone());
                        fiber::spawn(move || {
                            let _c = c;
                            unreachable!("a fiber cancelled before it started ran")
                        })
                    })
                    .collect();
                for h in &hs {
                    h.cancel();
                }
                for h in hs {
                    assert!(h.join().unwrap_err().is_cancelled());
                }
                assert_eq!(drops.load(SeqCst), (chunk + 1) * 100);
            }
            let s = fiber::stats().runtime;
            assert!(s.frames_allocated < 1_000, "{} frames allocated", s.frames_allocated);
        });
    });
}

// ---------------------------------------------------------------------------
// Runtime lifecycle
// ---------------------------------------------------------------------------

/// A runtime dropped with fibers that never ran (queued behind a root that
/// never yields until the end), fibers parked on channels holding values,
/// and detached sleepers: every closure and every value is dropped exactly
/// once, 50 times over, and the channel a plain thread keeps holds only
/// its buffered value afterwards.
#[test]
fn a_runtime_dropped_with_unstarted_and_parked_fibers_drops_every_value_once() {
    within(60, || {
        for _ in 0..50 {
            let drops = Arc::new(AtomicUsize::new(0));
            let rt = rt_fixed_grace(1, ms(50));
            let d = drops.clone();
            let (tx, rx) = chan::bounded::<Counted>(1);
            let made = rt.block_on(move || {
                let mut made = 0;
                // Parked senders holding a value each, one buffered.
                for _ in 0..4 {
                    let tx = tx.clone();
                    let v = Counted(d.clone());
                    made += 1;
                    fiber::spawn(move || {
                        let _ = tx.send(v);
                    });
                }
                // Detached sleepers owning a value.
                for _ in 0..4 {
                    let v = Counted(d.clone());
                    made += 1;
                    fiber::spawn(move || {
                        let _v = v;
                        stubborn_sleep();
                    });
                }
                // One sender buffered its value and ended; the other three
                // and the sleepers park.
                wait_until("the senders and sleepers to park", 10, || {
                    fiber::dump()
                        .fibers
                        .iter()
                        .filter(|f| f.state == fiber::core::state::FiberState::Parked)
                        .count()
                        >= 7
                });
                // Unstarted: spawned last, the root returns without yielding.
                for _ in 0..8 {
                    let v = Counted(d.clone());
                    made += 1;
                    fiber::spawn(move || drop(v));
                }
                made
            });
            drop(rt);
            // Only the buffered value is left in the channel: the parked
            // senders' values went with their fibers.
            assert_eq!(drops.load(SeqCst), made - 1);
            assert!(rx.try_recv().is_ok());
            assert!(rx.try_recv().is_err());
            assert_eq!(drops.load(SeqCst), made);
        }
    });
}

/// 100 runtimes with sockets, timers, blocking calls and grown workers,
/// built and dropped one after another: threads, descriptors and memory
/// maps go back to where they were.
#[test]
fn runtimes_built_and_dropped_leave_no_threads_fds_or_maps() {
    heavy("runtimes_built_and_dropped_leave_no_threads_fds_or_maps", 120, || {
        let round = || {
            let rt = fiber::Runtime::builder()
                .workers(2)
                .max_workers(3)
                .shutdown_timeout(ms(100))
                .build()
                .unwrap();
            rt.block_on(|| {
                let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let c = fiber::spawn(move || fiber::net::TcpStream::connect(addr).unwrap());
                let (_s, _) = l.accept().unwrap();
                let _c = c.join().unwrap();
                fiber::blocking(|| std::thread::sleep(ms(1)));
                fiber::spawn(|| fiber::sleep(Duration::from_secs(3600)));
                let (_tx, rx) = chan::bounded::<()>(0);
                fiber::spawn(move || rx.recv());
                fiber::sleep(ms(1)).unwrap();
            });
        };
        // Warm-up: the process-wide I/O driver and first-use caches.
        for _ in 0..3 {
            round();
        }
        let (threads, fds, maps) = (thread_count(), fd_count(), maps_count());
        for _ in 0..100 {
            round();
        }
        let settled = eventually(10, || {
            thread_count() <= threads && fd_count() <= fds && maps_count() <= maps + 16
        });
        assert!(
            settled,
            "threads {threads} -> {}, fds {fds} -> {}, maps {maps} -> {}",
            thread_count(),
            fd_count(),
            maps_count()
        );
    });
}

// ---------------------------------------------------------------------------
// Heap growth per operation, counted by the allocator
// ---------------------------------------------------------------------------

/// The heap bytes live in this process, kept by a counting allocator
/// around the system one (a plain relaxed counter: the tests that read it
/// run alone in a child process).
struct Counting;

static LIVE_BYTES: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

// SAFETY: every call forwards to the system allocator with the same
// arguments; the counter is bookkeeping only.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: forwarded as is.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> isize {
    LIVE_BYTES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Run `op` `n` times to warm up, then twice `n` times more, and return the
/// heap growth in bytes per run over the one of those two spans of `n`
/// runs that grew less.
fn growth_per_op(n: usize, mut op: impl FnMut(usize)) -> f64 {
    for i in 0..n {
        op(i);
    }
    let before = live_bytes();
    for i in n..2 * n {
        op(i);
    }
    let middle = live_bytes();
    for i in 2 * n..3 * n {
        op(i);
    }
    let after = live_bytes();
    eprintln!("live heap {before} -> {middle} -> {after} bytes over two spans of {n} runs");
    // The smaller growth of two equal spans: a leak grows in both, while a
    // bounded cache (a timer wheel between purges, which also gives room
    // back) can happen to grow across one of them.
    (middle - before).min(after - middle) as f64 / n as f64
}

/// A bound of a few bytes per run: a real leak of one small allocation
/// per run is 16 bytes or more; caches bounded by a constant (timer
/// purges at 1,024 entries, frame caches) spread below it over thousands
/// of runs.
const LEAK_BOUND: f64 = 8.0;

/// `Job::join` on a long-lived job from a fiber whose wait is cut short by
/// `with_timeout`, 3,000 times: the job keeps no record of the joiners that
/// left.
#[test]
fn cancelled_joins_of_a_long_lived_job_leave_no_heap_behind() {
    heavy("cancelled_joins_of_a_long_lived_job_leave_no_heap_behind", 60, || {
        rt2().block_on(|| {
            let (stop_tx, stop_rx) = chan::bounded::<()>(0);
            let (job_tx, job_rx) = chan::bounded::<fiber::Job>(1);
            let owner = fiber::spawn(move || {
                fiber::scope(|s| {
                    job_tx.send(s.job()).unwrap();
                    let _ = stop_rx.recv();
                })
            });
            let job = job_rx.recv().unwrap();
            let per_op = growth_per_op(1_500, |_| {
                let r = fiber::with_timeout(Duration::from_micros(20), || job.join());
                assert!(matches!(r, Err(_) | Ok(Err(_))), "{r:?}");
            });
            drop(stop_tx);
            owner.join().unwrap();
            assert!(per_op < LEAK_BOUND, "{per_op} bytes per cancelled join");
        });
    });
}

/// A long-lived `supervisor_scope` whose children panic (handles dropped),
/// 3,000 of them one after another, as a server's per-request children
/// might: the payloads and records of the failed children do not stay
/// with the scope until it ends.
#[test]
fn a_long_lived_supervisor_scope_keeps_nothing_of_its_failed_children() {
    heavy(
        "a_long_lived_supervisor_scope_keeps_nothing_of_its_failed_children",
        60,
        || {
            std::panic::set_hook(Box::new(|_| {}));
            rt2().block_on(|| {
                fiber::supervisor_scope(|s| {
                    let per_op = growth_per_op(1_500, |i| {
                        let h = s.spawn(move || -> u64 { std::panic::panic_any(vec![i as u8; 1024]) });
                        if i % 2 == 0 {
                            drop(h);
                        } else {
                            assert!(h.join().unwrap_err().is_panic());
                        }
                        wait_until("the child to end", 10, || fiber::stats().runtime.fibers_alive <= 1);
                    });
                    assert!(per_op < LEAK_BOUND, "{per_op} bytes per failed child");
                });
            });
        },
    );
}

/// A long-lived scope whose children return 1 KiB values through handles
/// that are dropped: each value goes with its child, not with the scope.
#[test]
fn a_long_lived_scope_keeps_nothing_of_its_ended_childrens_values() {
    heavy(
        "a_long_lived_scope_keeps_nothing_of_its_ended_childrens_values",
        60,
        || {
            rt2().block_on(|| {
                fiber::scope(|s| {
                    let per_op = growth_per_op(2_000, |i| {
                        let h = s.spawn(move || vec![i as u8; 1024]);
                        if i % 3 == 0 {
                            assert_eq!(h.join().unwrap().len(), 1024);
                        } else {
                            drop(h);
                        }
                        if i % 16 == 15 {
                            wait_until("the children to end", 10, || fiber::stats().runtime.fibers_alive <= 1);
                        }
                    });
                    assert!(per_op < LEAK_BOUND, "{per_op} bytes per child");
                });
            });
        },
    );
}

/// Named fibers (a fresh name each) spawned and joined 5,000 times, and
/// sockets cloned and dropped 2,000 times: nothing accumulates.
#[test]
fn named_fibers_and_cloned_sockets_leave_no_heap_behind() {
    heavy("named_fibers_and_cloned_sockets_leave_no_heap_behind", 60, || {
        rt2().block_on(|| {
            let per_op = growth_per_op(2_500, |i| {
                let h = fiber::Builder::new()
                    .name(format!("worker-{i}"))
                    .spawn(move || fiber::current().name().map(str::len))
                    .unwrap();
                assert!(h.join().unwrap().is_some());
            });
            assert!(per_op < LEAK_BOUND, "{per_op} bytes per named fiber");
            let l = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let c = fiber::spawn(move || fiber::net::TcpStream::connect(addr).unwrap());
            let (s, _) = l.accept().unwrap();
            let _c = c.join().unwrap();
            let fds = fd_count();
            let per_op = growth_per_op(1_000, |_| {
                let clone = s.try_clone().unwrap();
                clone.set_read_timeout(Some(ms(5))).unwrap();
                drop(clone);
            });
            assert!(per_op < LEAK_BOUND, "{per_op} bytes per socket clone");
            assert_eq!(fd_count(), fds);
        });
    });
}

/// Plain threads that wait on a fiber channel with a long timeout (a
/// fiber answers at once), 1,200 short-lived threads one after another:
/// nothing per thread stays behind.
#[test]
fn short_lived_threads_waiting_on_fiber_channels_leave_no_heap_behind() {
    heavy(
        "short_lived_threads_waiting_on_fiber_channels_leave_no_heap_behind",
        60,
        || {
            let rt = rt2();
            let handle = rt.handle();
            let per_op = growth_per_op(400, |i| {
                let (tx, rx) = chan::bounded::<usize>(0);
                let h = handle.spawn(move || tx.send(i).unwrap());
                let t = std::thread::spawn(move || rx.recv_timeout(Duration::from_secs(3600)).unwrap());
                assert_eq!(t.join().unwrap(), i);
                h.join().unwrap();
            });
            assert!(per_op < 16.0, "{per_op} bytes per thread");
            drop(rt);
        },
    );
}

/// `Condvar::wait_timeout(1h)` answered at once, `recv_timeout(1h)` and
/// `park_timeout(1h)` ended by their peer, 4,000 rounds: the heap does not
/// grow with the rounds (dead timer entries are purged in bulk).
#[test]
fn long_timed_waits_ended_at_once_leave_no_heap_behind() {
    heavy("long_timed_waits_ended_at_once_leave_no_heap_behind", 60, || {
        rt2().block_on(|| {
            let pair = Arc::new((fiber::sync::Mutex::new(0u64), fiber::sync::Condvar::new()));
            let (tx, rx) = chan::bounded::<u64>(0);
            let p = pair.clone();
            let peer = fiber::spawn(move || {
                for i in 0..12_000u64 {
                    let (m, c) = &*p;
                    *m.lock().unwrap() = i + 1;
                    c.notify_one();
                    if tx.send(i).is_err() {
                        break;
                    }
                }
            });
            let hour = Duration::from_secs(3600);
            let per_op = growth_per_op(2_000, |i| {
                let (m, c) = &*pair;
                let g = m.lock().unwrap();
                let (g, _) = c.wait_timeout_while(g, hour, |v| *v <= (i as u64)).unwrap();
                drop(g);
                assert_eq!(rx.recv_timeout(hour), Ok(i as u64));
            });
            drop(rx);
            peer.join().unwrap();
            assert!(per_op < LEAK_BOUND, "{per_op} bytes per round");
        });
    });
}

// ---------------------------------------------------------------------------
// Threads: the elastic pool and the blocking pool
// ---------------------------------------------------------------------------

use common::threads_named;

/// Five cycles of growth (two fibers computing without a yield point on a
/// pool of one worker, ceiling three) and idleness: after each the pool is
/// back at one worker thread, `on_thread_start` and `on_thread_stop` runs
/// differ by exactly the live workers, and after the drop they are equal
/// and no thread of the runtime is left.
#[test]
fn an_elastic_pool_grown_and_shrunk_five_times_keeps_threads_and_hooks_balanced() {
    within(60, || {
        let starts = Arc::new(AtomicUsize::new(0));
        let stops = Arc::new(AtomicUsize::new(0));
        let (a, b) = (starts.clone(), stops.clone());
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(3)
            .idle_timeout(ms(40))
            .thread_name("r41el")
            .shutdown_timeout(ms(200))
            .on_thread_start(move || {
                a.fetch_add(1, SeqCst);
            })
            .on_thread_stop(move || {
                b.fetch_add(1, SeqCst);
            })
            .build()
            .unwrap();
        let mut grew = 0;
        for cycle in 0..5 {
            rt.block_on(|| {
                let spinners: Vec<_> = (0..2).map(|_| fiber::spawn(|| common::load::spin(ms(80)))).collect();
                for s in spinners {
                    s.join().unwrap();
                }
            });
            grew = grew.max(rt.stats().scale_ups);
            let settled = eventually(10, || {
                let s = rt.stats();
                s.workers == 1 && threads_named("r41el-") == 2 // the worker and the monitor
            });
            assert!(
                settled,
                "cycle {cycle}: {} worker threads, stats: {}",
                threads_named("r41el-"),
                rt.stats()
            );
            assert_eq!(starts.load(SeqCst) - stops.load(SeqCst), 1, "cycle {cycle}");
        }
        assert!(grew > 0, "the pool never grew");
        drop(rt);
        assert_eq!(starts.load(SeqCst), stops.load(SeqCst));
        assert_eq!(threads_named("r41el"), 0);
    });
}

/// Sixteen blocking calls at once start sixteen pool threads; once idle
/// for the keep-alive (10 s) they all retire while the runtime lives on,
/// and the next call starts one again.
#[test]
fn idle_blocking_pool_threads_retire_while_the_runtime_lives() {
    within(60, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .thread_name("r41bp")
            .shutdown_timeout(ms(200))
            .build()
            .unwrap();
        rt.block_on(|| {
            let barrier = Arc::new(std::sync::Barrier::new(16));
            let calls: Vec<_> = (0..16)
                .map(|_| {
                    let b = barrier.clone();
                    fiber::spawn(move || fiber::blocking(move || b.wait().is_leader()))
                })
                .collect();
            let leaders = calls
                .into_iter()
                .filter(|_| true)
                .map(|c| c.join().unwrap())
                .filter(|l| *l)
                .count();
            assert_eq!(leaders, 1);
        });
        assert_eq!(threads_named("r41bp-blocking"), 16);
        assert!(
            eventually(20, || threads_named("r41bp-blocking") == 0),
            "{} idle blocking threads left",
            threads_named("r41bp-blocking")
        );
        assert_eq!(rt.block_on(|| fiber::blocking(|| 7)), 7);
        assert_eq!(threads_named("r41bp-blocking"), 1);
        drop(rt);
        assert!(eventually(5, || threads_named("r41bp") == 0));
    });
}

// ---------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------

/// 1,200 job trees (a scope, three children each with a nested scope of
/// three grandchildren, all parked) cancelled from outside through their
/// `Job`: every job created ends (completed, failed or cancelled), every
/// fiber ends, and the heap does not grow with the trees.
#[test]
fn job_trees_cancelled_again_and_again_end_every_job_and_keep_no_heap() {
    heavy(
        "job_trees_cancelled_again_and_again_end_every_job_and_keep_no_heap",
        60,
        || {
            rt2().block_on(|| {
                let before = fiber::stats().jobs;
                let per_op = growth_per_op(400, |_| {
                    let (job_tx, job_rx) = chan::bounded::<fiber::Job>(1);
                    let tree = fiber::spawn(move || {
                        fiber::scope(|s| {
                            job_tx.send(s.job()).unwrap();
                            for _ in 0..3 {
                                s.spawn(|| {
                                    fiber::scope(|s| {
                                        for _ in 0..3 {
                                            s.spawn(|| fiber::sleep(Duration::from_secs(3600)));
                                        }
                                        let _ = fiber::sleep(Duration::from_secs(3600));
                                    })
                                });
                            }
                        })
                    });
                    let job = job_rx.recv().unwrap();
                    wait_until("the tree to park", 10, || fiber::stats().runtime.fibers_alive >= 14);
                    job.cancel();
                    assert_eq!(job.join(), Ok(fiber::JobState::Cancelled));
                    tree.join().unwrap();
                });
                wait_until("the fibers to end", 10, || fiber::stats().runtime.fibers_alive == 1);
                let after = fiber::stats().jobs;
                let created = after.jobs_created - before.jobs_created;
                let ended = (after.jobs_completed - before.jobs_completed)
                    + (after.jobs_failed - before.jobs_failed)
                    + (after.jobs_cancelled - before.jobs_cancelled);
                assert!(created >= 1_200 * 13, "{created} jobs created");
                assert_eq!(created, ended, "{after}");
                assert!(per_op < 32.0, "{per_op} bytes per cancelled tree");
            });
        },
    );
}
