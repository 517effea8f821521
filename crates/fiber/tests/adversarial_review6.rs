//! Adversarial review 6: scale, churn and resource limits.
//!
//! Programs an experienced user of Go, tokio or std threads writes without
//! thinking twice, run at sizes that expose leaks (timers, jobs, frames,
//! fiber-locals, file descriptors, stacks that pile up under churn) and
//! super-linear costs (queues scanned on removal, parked fibers that cost
//! CPU, selects over many channels). Every measurement runs in a child
//! process of its own (RSS, fd and job counters are process-wide; a heavy
//! child could exhaust memory), one heavy child at a time, and timing is
//! asserted as a ratio between two sizes with generous bounds: ten times
//! the work must take less than thirty times the time.

use fiber::chan::{self, Select};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
use common::{in_child, ms};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// One heavy child at a time: the parent's test threads run in parallel,
/// and two timing children on a 2-core machine would measure each other.
static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn heavy(scenario: &str, secs: u64, body: impl FnOnce()) {
    let _one_at_a_time = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    in_child(scenario, secs, body);
}

/// Resident set size of this process, in KiB (`/proc/self/statm`).
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    // SAFETY: sysconf is always safe to call.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    pages * page / 1024
}

/// Virtual size of this process, in KiB.
fn vm_kib() -> u64 {
    common::vm_size_bytes() / 1024
}

/// Open file descriptors of this process.
fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// User + system CPU time of this process.
fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all zeroes is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage with RUSAGE_SELF and a valid, writable struct.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Exactly `workers` workers (growth off), 256 KiB stacks, short grace.
fn rt_fixed(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .stack_size(256 * 1024)
        .shutdown_timeout(ms(300))
        .build()
        .unwrap()
}

fn parked() -> usize {
    fiber::stats().runtime.fibers_parked
}

fn alive() -> usize {
    fiber::stats().runtime.fibers_alive
}

/// Run `measure(n)` for a small and a large size (best of two each,
/// interleaved; three took over a minute of the CI gate) and return how much the cost per unit grew, with both
/// times. `units(n)` is the work at size n (n itself for linear work, a
/// constant for work that must not depend on n).
fn growth(
    small: usize,
    large: usize,
    units: impl Fn(usize) -> f64,
    mut measure: impl FnMut(usize) -> Duration,
) -> (f64, Duration, Duration) {
    let (mut ts, mut tl) = (Duration::MAX, Duration::MAX);
    for _ in 0..2 {
        ts = ts.min(measure(small));
        tl = tl.min(measure(large));
    }
    let per_small = ts.as_secs_f64() / units(small);
    let per_large = tl.as_secs_f64() / units(large);
    (per_large / per_small, ts, tl)
}

/// Ten times the work must take less than thirty times the time: the cost
/// per unit may grow at most 3x between the two sizes.
fn assert_linear(what: &str, (g, ts, tl): (f64, Duration, Duration)) {
    eprintln!("{what}: small {ts:?}, large {tl:?}, per-unit growth {g:.2}x");
    assert!(
        g < 3.0,
        "{what}: the cost per unit grew {g:.2}x (small {ts:?}, large {tl:?})"
    );
}

fn linear(n: usize) -> f64 {
    n as f64
}

fn constant(_: usize) -> f64 {
    1.0
}

#[inline(never)]
fn recurse_forever(depth: u64) -> u64 {
    let buf = [depth as u8; 512];
    std::hint::black_box(&buf);
    if depth == u64::MAX {
        return 0;
    }
    recurse_forever(depth + 1).wrapping_add(buf[7] as u64)
}

#[inline(never)]
fn recurse_to(depth: u64) -> u64 {
    let buf = [depth as u8; 512];
    std::hint::black_box(&buf);
    if depth == 0 {
        return 1;
    }
    let r = recurse_to(depth - 1);
    // Keep the frame's buffer alive across the call (no tail call).
    std::hint::black_box(&buf);
    r
}

/// Run `body` in a child process and return its exit status and stderr
/// (for scenarios that must abort), one heavy scenario at a time.
fn child_outcome(scenario: &str, secs: u64, body: impl FnOnce()) -> Option<(std::process::ExitStatus, String)> {
    let _one_at_a_time = HEAVY.lock().unwrap_or_else(|e| e.into_inner());
    common::child_outcome(scenario, secs, &[("RUST_BACKTRACE", "0")], body)
}

// ---------------------------------------------------------------------------
// 1. Churn: nothing may pile up
// ---------------------------------------------------------------------------

/// Go: `for { select { case v := <-ch: ...; case <-time.After(10 * time.Millisecond): } }`
/// is the classic timeout loop. 200,000 selects whose `after(10 ms)` arm
/// loses (the value comes from a producer fiber over a rendezvous channel,
/// so most selects park and arm a timer): pending timers stay bounded and
/// so does the resident memory.
#[test]
fn select_200k_times_with_a_losing_after_arm_keeps_timers_and_memory_bounded() {
    heavy(
        "select_200k_times_with_a_losing_after_arm_keeps_timers_and_memory_bounded",
        300,
        || {
            const N: u64 = 200_000;
            let rt = rt_fixed(2);
            rt.block_on(|| {
                let (tx, rx) = chan::bounded::<u64>(0);
                let producer = fiber::spawn(move || {
                    for i in 0..N {
                        tx.send(i).unwrap();
                    }
                });
                let (mut warm_rss, mut max_pending, mut timeouts) = (0, 0, 0u64);
                let mut i = 0;
                while i < N {
                    fiber::select! {
                        recv(rx) -> v => { assert_eq!(v, Ok(i)); i += 1; }
                        recv(chan::after(ms(10))) -> _ => timeouts += 1,
                    }
                    if i == 20_000 {
                        warm_rss = rss_kib();
                    }
                    if i % 1_000 == 0 {
                        max_pending = max_pending.max(fiber::stats().runtime.timers_pending);
                    }
                }
                producer.join().unwrap();
                let end_rss = rss_kib();
                let pending = fiber::stats().runtime.timers_pending;
                eprintln!(
                    "rss {warm_rss} -> {end_rss} KiB, max pending {max_pending}, end pending {pending}, {timeouts} timeouts"
                );
                assert!(max_pending < 50_000, "{max_pending} timers pending at once");
                assert!(end_rss < warm_rss + 32 * 1024, "RSS grew from {warm_rss} to {end_rss} KiB");
            });
        },
    );
}

/// tokio: `timeout(Duration::from_secs(3600), fut)` around work that is
/// done at once, 100,000 times (every other body parks for a value from
/// another fiber): no timer, job or memory is left behind.
#[test]
fn with_timeout_100k_times_leaves_no_timers_jobs_or_memory() {
    heavy("with_timeout_100k_times_leaves_no_timers_jobs_or_memory", 300, || {
        const N: u32 = 100_000;
        let rt = rt_fixed(2);
        rt.block_on(|| {
            let (tx, rx) = chan::bounded::<u32>(0);
            let producer = fiber::spawn(move || {
                for i in 0..N / 2 {
                    if tx.send(i).is_err() {
                        break;
                    }
                }
            });
            let jobs0 = fiber::stats().jobs;
            let mut warm_rss = 0;
            for i in 0..N {
                let v = fiber::with_timeout(Duration::from_secs(3600), || {
                    if i % 2 == 0 {
                        rx.recv().unwrap()
                    } else {
                        i
                    }
                })
                .expect("an hour is enough");
                if i % 2 == 0 {
                    assert_eq!(v, i / 2);
                } else {
                    assert_eq!(v, i);
                }
                if i == 10_000 {
                    warm_rss = rss_kib();
                }
            }
            producer.join().unwrap();
            let s = fiber::stats();
            let end_rss = rss_kib();
            let created = s.jobs.jobs_created - jobs0.jobs_created;
            let ended = (s.jobs.jobs_completed + s.jobs.jobs_failed + s.jobs.jobs_cancelled)
                - (jobs0.jobs_completed + jobs0.jobs_failed + jobs0.jobs_cancelled);
            eprintln!(
                "rss {warm_rss} -> {end_rss} KiB, timers pending {}, jobs created {created}, ended {ended}",
                s.runtime.timers_pending
            );
            assert!(
                s.runtime.timers_pending <= 8_192,
                "{} timers pending",
                s.runtime.timers_pending
            );
            assert!(created >= N as u64, "only {created} jobs for {N} with_timeouts");
            assert!(created - ended <= 2, "{created} jobs created, {ended} ended");
            assert!(
                end_rss < warm_rss + 32 * 1024,
                "RSS grew from {warm_rss} to {end_rss} KiB"
            );
        });
    });
}

/// Channels dropped while fibers are parked on them, 20 rounds of 1,000
/// parked receivers and 1,000 parked senders: each wait ends with the
/// disconnection, every fiber ends, memory does not grow round after round.
#[test]
fn channels_dropped_with_parked_waiters_free_everything() {
    heavy("channels_dropped_with_parked_waiters_free_everything", 300, || {
        let rt = rt_fixed(2);
        rt.block_on(|| {
            let mut rss = Vec::new();
            for _round in 0..20 {
                let base = alive();
                let mut ends = Vec::new();
                let mut hs = Vec::new();
                for _ in 0..1_000 {
                    let (tx, rx) = chan::bounded::<Vec<u8>>(0);
                    let (tx2, rx2) = chan::bounded::<Vec<u8>>(0);
                    hs.push(fiber::spawn(move || rx.recv().is_err()));
                    hs.push(fiber::spawn(move || tx2.send(vec![7u8; 512]).is_err()));
                    ends.push((tx, rx2));
                }
                common::wait_until("2,000 parked waiters", 20, || parked() >= 2_000);
                drop(ends);
                for h in hs {
                    assert!(h.join().unwrap(), "a wait did not end with the disconnection");
                }
                common::wait_until("the round's fibers to end", 20, || alive() <= base);
                rss.push(rss_kib());
            }
            eprintln!("rss per round: {rss:?}");
            assert!(
                rss[19] < rss[2] + 16 * 1024,
                "RSS grew from {} to {} KiB",
                rss[2],
                rss[19]
            );
        });
    });
}

/// Go's `go f()` / tokio's `spawn` with the handle dropped: 100,000
/// detached fibers in bursts of 1,000. Every one runs, none stays alive,
/// frames are reused (not allocated per fiber) and memory stays flat.
#[test]
fn detached_fibers_100k_with_dropped_handles_are_reused_not_leaked() {
    heavy(
        "detached_fibers_100k_with_dropped_handles_are_reused_not_leaked",
        300,
        || {
            let rt = rt_fixed(2);
            rt.block_on(|| {
                let ran = Arc::new(AtomicUsize::new(0));
                let base = alive();
                let mut warm_rss = 0;
                for burst in 0..100 {
                    for _ in 0..1_000 {
                        let ran = ran.clone();
                        drop(fiber::spawn(move || {
                            let _ = fiber::yield_now();
                            ran.fetch_add(1, SeqCst);
                        }));
                    }
                    let want = (burst + 1) * 1_000;
                    common::wait_until("the burst to run", 20, || ran.load(SeqCst) == want && alive() <= base);
                    if burst == 9 {
                        warm_rss = rss_kib();
                    }
                }
                let s = fiber::stats().runtime;
                let end_rss = rss_kib();
                eprintln!(
                    "frames allocated {}, rss {warm_rss} -> {end_rss} KiB",
                    s.frames_allocated
                );
                assert_eq!(ran.load(SeqCst), 100_000);
                assert!(
                    s.frames_allocated < 10_000,
                    "{} frames allocated for 100,000 fibers in bursts of 1,000",
                    s.frames_allocated
                );
                assert!(
                    end_rss < warm_rss + 16 * 1024,
                    "RSS grew from {warm_rss} to {end_rss} KiB"
                );
            });
        },
    );
}

/// `std::thread::scope` in a loop: 100,000 scopes, each with one joined
/// and one unjoined child. Every job the scopes make ends, memory is flat.
#[test]
fn scopes_opened_and_closed_100k_times_end_every_job() {
    heavy("scopes_opened_and_closed_100k_times_end_every_job", 300, || {
        let rt = rt_fixed(2);
        rt.block_on(|| {
            let jobs0 = fiber::stats().jobs;
            let mut total = 0u64;
            let mut warm_rss = 0;
            for i in 0..100_000u64 {
                let mut unjoined = 0u64;
                let joined = fiber::scope(|s| {
                    s.spawn(|| unjoined = i);
                    s.spawn(move || i + 1).join().unwrap()
                });
                total += joined + unjoined;
                if i == 10_000 {
                    warm_rss = rss_kib();
                }
            }
            assert_eq!(total, (0..100_000u64).map(|i| 2 * i + 1).sum::<u64>());
            let s = fiber::stats();
            let end_rss = rss_kib();
            let created = s.jobs.jobs_created - jobs0.jobs_created;
            let ended = (s.jobs.jobs_completed + s.jobs.jobs_failed + s.jobs.jobs_cancelled)
                - (jobs0.jobs_completed + jobs0.jobs_failed + jobs0.jobs_cancelled);
            eprintln!("jobs created {created}, ended {ended}, rss {warm_rss} -> {end_rss} KiB");
            assert!(created >= 100_000, "{created}");
            assert!(created - ended <= 2, "{created} jobs created, {ended} ended");
            assert!(
                end_rss < warm_rss + 16 * 1024,
                "RSS grew from {warm_rss} to {end_rss} KiB"
            );
        });
    });
}

struct Counted(#[allow(dead_code)] Vec<u8>, Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.1.fetch_add(1, SeqCst);
    }
}

fiber::fiber_local! {
    static LOCAL: std::cell::RefCell<Option<Counted>> = const { std::cell::RefCell::new(None) };
}

/// `thread_local!` set in every short-lived thread: 100,000 fibers each
/// put 1 KiB in a fiber-local. Every value is dropped (once), memory flat.
#[test]
fn fiber_locals_set_in_100k_short_fibers_are_all_dropped() {
    heavy("fiber_locals_set_in_100k_short_fibers_are_all_dropped", 300, || {
        let rt = rt_fixed(2);
        rt.block_on(|| {
            let drops = Arc::new(AtomicUsize::new(0));
            let mut warm_rss = 0;
            for burst in 0..100 {
                let hs: Vec<_> = (0..1_000)
                    .map(|_| {
                        let drops = drops.clone();
                        fiber::spawn(move || {
                            LOCAL.with_borrow_mut(|l| *l = Some(Counted(vec![1u8; 1024], drops)));
                            let _ = fiber::yield_now();
                            LOCAL.with_borrow(|l| l.is_some())
                        })
                    })
                    .collect();
                for h in hs {
                    assert!(h.join().unwrap());
                }
                if burst == 9 {
                    warm_rss = rss_kib();
                }
            }
            let end_rss = rss_kib();
            eprintln!("drops {}, rss {warm_rss} -> {end_rss} KiB", drops.load(SeqCst));
            assert_eq!(drops.load(SeqCst), 100_000);
            assert!(
                end_rss < warm_rss + 16 * 1024,
                "RSS grew from {warm_rss} to {end_rss} KiB"
            );
        });
    });
}

/// A server's life: 1,000 rounds of connect / accept / one byte each way /
/// close, a UDP socket and a Unix pair opened and closed, and a read
/// abandoned by a 1 ms `with_timeout`. The fd count comes back to where it
/// was (nothing registered with the poller keeps a descriptor).
#[test]
fn sockets_opened_and_closed_in_a_loop_return_the_fd_count_to_baseline() {
    heavy(
        "sockets_opened_and_closed_in_a_loop_return_the_fd_count_to_baseline",
        300,
        || {
            use std::io::{Read, Write};
            let rt = rt_fixed(2);
            rt.block_on(|| {
                let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = listener.local_addr().unwrap();
                let round = |i: usize| {
                    let server = fiber::spawn({
                        let listener = listener.try_clone().unwrap();
                        move || {
                            let (mut s, _) = listener.accept().unwrap();
                            let mut b = [0u8; 1];
                            s.read_exact(&mut b).unwrap();
                            s.write_all(&b).unwrap();
                        }
                    });
                    let mut c = fiber::net::TcpStream::connect(addr).unwrap();
                    c.write_all(&[i as u8]).unwrap();
                    let mut b = [0u8; 1];
                    c.read_exact(&mut b).unwrap();
                    assert_eq!(b[0], i as u8);
                    server.join().unwrap();
                    // A read nobody answers, abandoned by a deadline.
                    let (mut a, _b) = fiber::net::unix::UnixStream::pair().unwrap();
                    let r = fiber::with_timeout(ms(1), || a.read(&mut [0u8; 8]));
                    assert!(r.is_err() || r.as_ref().unwrap().is_err(), "{r:?}");
                    let u = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                    u.send_to(b"x", u.local_addr().unwrap()).unwrap();
                    let mut d = [0u8; 4];
                    assert_eq!(u.recv(&mut d).unwrap(), 1);
                };
                for i in 0..5 {
                    round(i);
                }
                let base = fd_count();
                for i in 0..1_000 {
                    round(i);
                }
                // Closing may be deferred to the poller: give it a moment.
                let start = Instant::now();
                while fd_count() > base && start.elapsed() < Duration::from_secs(5) {
                    fiber::sleep(ms(10)).unwrap();
                }
                let end = fd_count();
                eprintln!("fds {base} -> {end}");
                assert!(end <= base, "{end} fds open after 1,000 rounds, {base} before");
            });
        },
    );
}

/// An unbounded channel filled with 500,000 values and drained, five times
/// over: the memory of a drained buffer is reused or given back, it does
/// not accumulate round after round.
#[test]
fn an_unbounded_channel_filled_and_drained_repeatedly_does_not_grow() {
    heavy(
        "an_unbounded_channel_filled_and_drained_repeatedly_does_not_grow",
        300,
        || {
            let rt = rt_fixed(2);
            rt.block_on(|| {
                let (tx, rx) = chan::unbounded::<u64>();
                let mut rss = Vec::new();
                for round in 0..6u64 {
                    for i in 0..500_000 {
                        tx.send(round * 1_000_000 + i).unwrap();
                    }
                    for i in 0..500_000 {
                        assert_eq!(rx.try_recv(), Ok(round * 1_000_000 + i));
                    }
                    rss.push(rss_kib());
                }
                eprintln!("rss per round: {rss:?}");
                assert!(rss[5] < rss[1] + 8 * 1024, "RSS grew from {} to {} KiB", rss[1], rss[5]);
            });
        },
    );
}

// ---------------------------------------------------------------------------
// 2. No super-linear costs
// ---------------------------------------------------------------------------

/// Go: many goroutines blocked sending on one unbuffered channel, then the
/// receiver drains them. The cost per receive must not grow with the
/// number of parked senders (5,000 against 50,000), for a rendezvous and a
/// full buffered channel, and every value arrives once.
#[test]
fn draining_many_parked_senders_costs_the_same_per_value() {
    heavy("draining_many_parked_senders_costs_the_same_per_value", 300, || {
        let rt = rt_fixed(2);
        for cap in [0usize, 16] {
            let g = growth(5_000, 50_000, linear, |n| {
                rt.block_on(move || {
                    let (tx, rx) = chan::bounded::<usize>(cap);
                    let hs: Vec<_> = (0..n + cap)
                        .map(|i| {
                            let tx = tx.clone();
                            fiber::spawn(move || tx.send(i).unwrap())
                        })
                        .collect();
                    common::wait_until("the senders to park", 60, || parked() >= n);
                    let t = Instant::now();
                    let mut seen = vec![false; n + cap];
                    for _ in 0..n + cap {
                        let v = rx.recv().unwrap();
                        assert!(!seen[v], "{v} received twice");
                        seen[v] = true;
                    }
                    let d = t.elapsed();
                    for h in hs {
                        h.join().unwrap();
                    }
                    d
                })
            });
            assert_linear(&format!("drain of parked senders, cap {cap}"), g);
        }
    });
}

/// Removing one waiter from the middle of a long queue is O(1)
/// (spec/chan.md section 2, spec/sync.md section 2, spec/jobs.md section
/// 4): cancelling the same 2,500 waiters costs the same whether 5,000 or
/// 50,000 wait with them, for a channel's receivers, a semaphore's
/// acquirers, a condvar's waiters and a job's joiners. The others are
/// served afterwards.
#[test]
fn cancelling_2500_waiters_from_the_middle_does_not_depend_on_the_queue_length() {
    heavy(
        "cancelling_2500_waiters_from_the_middle_does_not_depend_on_the_queue_length",
        400,
        || {
            const K: usize = 2_500;
            static SERVED: AtomicUsize = AtomicUsize::new(0);
            fn served(ok: bool) -> bool {
                if ok {
                    SERVED.fetch_add(1, SeqCst);
                }
                ok
            }
            let rt = rt_fixed(2);
            // Each kind: spawn n waiters, let the test cancel K of them from
            // the middle, then release the rest.
            type Setup = fn(usize) -> (Vec<fiber::JoinHandle<bool>>, Box<dyn FnOnce() + Send>);
            let kinds: [(&str, Setup); 4] = [
                ("channel receivers", |n| {
                    let (tx, rx) = chan::bounded::<()>(0);
                    let hs = (0..n)
                        .map(|_| {
                            let rx = rx.clone();
                            fiber::spawn(move || served(rx.recv().is_ok()))
                        })
                        .collect();
                    (
                        hs,
                        Box::new(move || {
                            for _ in 0..n - K {
                                tx.send(()).unwrap();
                            }
                        }),
                    )
                }),
                ("semaphore acquirers", |n| {
                    let sem = Arc::new(fiber::sync::Semaphore::new(0));
                    let hs = (0..n)
                        .map(|_| {
                            let sem = sem.clone();
                            fiber::spawn(move || served(sem.acquire().map(|p| p.forget()).is_ok()))
                        })
                        .collect();
                    (hs, Box::new(move || sem.add_permits(n)))
                }),
                ("condvar waiters", |n| {
                    let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
                    let hs = (0..n)
                        .map(|_| {
                            let pair = pair.clone();
                            fiber::spawn(move || {
                                let g = pair.0.lock().unwrap();
                                let g = pair.1.wait_while(g, |go| !*go).unwrap();
                                served(*g)
                            })
                        })
                        .collect();
                    (
                        hs,
                        Box::new(move || {
                            *pair.0.lock().unwrap() = true;
                            pair.1.notify_all();
                        }),
                    )
                }),
                ("job joiners", |n| {
                    let (stop_tx, stop_rx) = chan::bounded::<()>(0);
                    let (job_tx, job_rx) = chan::bounded::<fiber::Job>(1);
                    let target = fiber::spawn(move || {
                        job_tx.send(fiber::Job::current()).unwrap();
                        let _ = stop_rx.recv();
                    });
                    let job = job_rx.recv().unwrap();
                    let hs = (0..n)
                        .map(|_| {
                            let job = job.clone();
                            fiber::spawn(move || served(job.join().is_ok()))
                        })
                        .collect();
                    (
                        hs,
                        Box::new(move || {
                            drop(stop_tx);
                            let _ = target.join();
                        }),
                    )
                }),
            ];
            for (what, setup) in kinds {
                let g = growth(5_000, 50_000, constant, |n| {
                    rt.block_on(move || {
                        let base = parked();
                        let (hs, release) = setup(n);
                        // The joiners' target fiber parks too.
                        let extra = usize::from(what == "job joiners");
                        common::wait_until(what, 60, || parked() >= base + n + extra);
                        let middle = &hs[n / 2 - K / 2..n / 2 + K / 2];
                        let before = parked();
                        let t = Instant::now();
                        for h in middle {
                            h.cancel();
                        }
                        while parked() > before - K {
                            assert!(
                                t.elapsed() < Duration::from_secs(60),
                                "{what}: cancelled waiters never left"
                            );
                            fiber::yield_now().unwrap();
                        }
                        let d = t.elapsed();
                        release();
                        for (i, h) in hs.into_iter().enumerate() {
                            let in_middle = (n / 2 - K / 2..n / 2 + K / 2).contains(&i);
                            match h.join() {
                                Ok(_) => assert!(!in_middle, "{what}: cancelled waiter {i} joined Ok"),
                                Err(e) => assert!(in_middle && e.is_cancelled(), "{what}: waiter {i}: {e:?}"),
                            }
                        }
                        // A cancelled waiter woken but not yet gone may still
                        // win its wait (a completed operation beats the
                        // cancellation); a channel's values are each taken
                        // exactly once.
                        let got = SERVED.swap(0, SeqCst);
                        if what == "channel receivers" {
                            assert_eq!(got, n - K, "{what}: each value taken once");
                        } else {
                            assert!(got >= n - K, "{what}: only {got} of {} served", n - K);
                        }
                        d
                    })
                });
                // A few milliseconds either way: allow 50 ms of noise (a scan
                // of the queue per removal would take hundreds).
                let (growth, small, large) = g;
                eprintln!("cancel of {K} {what} from the middle: {small:?} among 5,000, {large:?} among 50,000");
                assert!(
                    growth < 3.0 || large < ms(50),
                    "cancel of {K} {what}: {small:?} among 5,000 waiters, {large:?} among 50,000"
                );
            }
        },
    );
}

/// `Select` over 1,000 channels, 300 rounds, each woken by a send on a
/// different channel: the cost per (round x arm) does not grow from 100 to
/// 1,000 arms, and each round reports the right arm and value.
#[test]
fn a_select_over_1000_channels_costs_linear_in_its_arms() {
    heavy("a_select_over_1000_channels_costs_linear_in_its_arms", 300, || {
        const ROUNDS: usize = 300;
        let rt = rt_fixed(2);
        let g = growth(
            100,
            1_000,
            |arms| (arms * ROUNDS) as f64,
            |arms| {
                rt.block_on(move || {
                    let (txs, rxs): (Vec<_>, Vec<_>) = (0..arms).map(|_| chan::bounded::<usize>(0)).unzip();
                    let pick = move |r: usize| (r * 7_919) % arms;
                    let producer = fiber::spawn(move || {
                        for r in 0..ROUNDS {
                            txs[pick(r)].send(r).unwrap();
                        }
                    });
                    let t = Instant::now();
                    for r in 0..ROUNDS {
                        let mut sel = Select::new();
                        for rx in &rxs {
                            sel.recv(rx);
                        }
                        let op = sel.select();
                        let i = op.index();
                        assert_eq!(i, pick(r));
                        assert_eq!(op.recv(&rxs[i]).unwrap(), r);
                    }
                    let d = t.elapsed();
                    producer.join().unwrap();
                    d
                })
            },
        );
        assert_linear("select over many channels", g);
    });
}

/// Many selects parked on the same 32 channels (500 against 5,000): each
/// send wakes one, which then leaves the 31 other queues. Leaving a queue
/// is O(1), so the cost per send stays flat; every value is received once.
#[test]
fn many_selects_parked_on_the_same_channels_leave_them_in_constant_time() {
    heavy(
        "many_selects_parked_on_the_same_channels_leave_them_in_constant_time",
        300,
        || {
            const C: usize = 32;
            let rt = rt_fixed(2);
            let g = growth(500, 5_000, linear, |s| {
                rt.block_on(move || {
                    let (txs, rxs): (Vec<_>, Vec<_>) = (0..C).map(|_| chan::bounded::<usize>(0)).unzip();
                    let rxs = Arc::new(rxs);
                    let base = parked();
                    let hs: Vec<_> = (0..s)
                        .map(|_| {
                            let rxs = rxs.clone();
                            fiber::spawn(move || {
                                let mut sel = Select::new();
                                for rx in rxs.iter() {
                                    sel.recv(rx);
                                }
                                let op = sel.select();
                                let i = op.index();
                                op.recv(&rxs[i]).unwrap()
                            })
                        })
                        .collect();
                    common::wait_until("the selects to park", 60, || parked() >= base + s);
                    let t = Instant::now();
                    for j in 0..s {
                        txs[j % C].send(j).unwrap();
                    }
                    let mut got: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
                    let d = t.elapsed();
                    got.sort_unstable();
                    assert!(got.iter().copied().eq(0..s), "values lost or duplicated");
                    d
                })
            });
            assert_linear("parked selects woken one by one", g);
        },
    );
}

/// Cancelling a scope of 5,000 against 50,000 parked children: linear.
#[test]
fn cancelling_a_scope_of_50k_children_is_linear() {
    heavy("cancelling_a_scope_of_50k_children_is_linear", 300, || {
        let rt = rt_fixed(2);
        let g = growth(5_000, 50_000, linear, |n| {
            rt.block_on(move || {
                let base = parked();
                let ended = Arc::new(AtomicUsize::new(0));
                let e = ended.clone();
                let h = fiber::spawn(move || {
                    fiber::scope(|s| {
                        for _ in 0..n {
                            let e = e.clone();
                            s.spawn(move || {
                                let r = fiber::sleep(Duration::from_secs(3600));
                                assert!(r.is_err());
                                e.fetch_add(1, SeqCst);
                            });
                        }
                    })
                });
                common::wait_until("the children to park", 60, || parked() > base + n);
                let t = Instant::now();
                h.cancel();
                let r = h.join();
                let d = t.elapsed();
                assert!(r.is_err_and(|e| e.is_cancelled()));
                assert_eq!(ended.load(SeqCst), n);
                d
            })
        });
        assert_linear("cancel of a wide scope", g);
    });
}

/// 100,000 fibers parked on one channel, released by its disconnection and
/// joined newest first (against 10,000): linear, every value right.
#[test]
fn joining_100k_fibers_in_reverse_order_is_linear() {
    heavy("joining_100k_fibers_in_reverse_order_is_linear", 300, || {
        let rt = rt_fixed(2);
        let g = growth(10_000, 100_000, linear, |n| {
            rt.block_on(move || {
                let base = parked();
                let (tx, rx) = chan::bounded::<()>(0);
                let hs: Vec<_> = (0..n)
                    .map(|i| {
                        let rx = rx.clone();
                        fiber::spawn(move || {
                            assert!(rx.recv().is_err());
                            i
                        })
                    })
                    .collect();
                common::wait_until("the fibers to park", 60, || parked() >= base + n);
                let t = Instant::now();
                drop(tx);
                for (i, h) in hs.into_iter().enumerate().rev() {
                    assert_eq!(h.join().unwrap(), i);
                }
                t.elapsed()
            })
        });
        assert_linear("reverse join", g);
    });
}

/// A mutex with 1,000 against 10,000 fibers parked on it, then released:
/// every fiber gets it once, in linear time. And a barrier, a WaitGroup
/// and a condvar's `notify_all` with as many parties.
#[test]
fn sync_primitives_with_10k_parked_fibers_are_linear() {
    heavy("sync_primitives_with_10k_parked_fibers_are_linear", 400, || {
        let rt = rt_fixed(2);
        let g = growth(1_000, 10_000, linear, |n| {
            rt.block_on(move || {
                let base = parked();
                let m = Arc::new(fiber::sync::Mutex::new(Vec::new()));
                let guard = m.lock().unwrap();
                let hs: Vec<_> = (0..n)
                    .map(|i| {
                        let m = m.clone();
                        fiber::spawn(move || m.lock().unwrap().push(i))
                    })
                    .collect();
                common::wait_until("the lockers to park", 60, || parked() >= base + n);
                let t = Instant::now();
                drop(guard);
                for h in hs {
                    h.join().unwrap();
                }
                let d = t.elapsed();
                let mut v = std::mem::take(&mut *m.lock().unwrap());
                v.sort_unstable();
                assert!(v.into_iter().eq(0..n));
                d
            })
        });
        assert_linear("mutex hand-over", g);

        let g = growth(1_000, 10_000, linear, |n| {
            rt.block_on(move || {
                let barrier = Arc::new(fiber::sync::Barrier::new(n));
                let t = Instant::now();
                let hs: Vec<_> = (0..n)
                    .map(|_| {
                        let b = barrier.clone();
                        fiber::spawn(move || b.wait().is_leader())
                    })
                    .collect();
                let leaders = hs
                    .into_iter()
                    .filter(|_| true)
                    .map(|h| h.join().unwrap())
                    .filter(|&l| l)
                    .count();
                assert_eq!(leaders, 1);
                t.elapsed()
            })
        });
        assert_linear("barrier", g);

        let g = growth(1_000, 10_000, linear, |n| {
            rt.block_on(move || {
                let wg = fiber::sync::WaitGroup::new();
                let done = Arc::new(AtomicUsize::new(0));
                let (tx, rx) = chan::bounded::<()>(0);
                let t = Instant::now();
                for _ in 0..n {
                    let wg = wg.clone();
                    let done = done.clone();
                    let rx = rx.clone();
                    fiber::spawn(move || {
                        let _ = rx.recv();
                        done.fetch_add(1, SeqCst);
                        drop(wg);
                    });
                }
                drop(tx);
                wg.wait();
                assert_eq!(done.load(SeqCst), n);
                t.elapsed()
            })
        });
        assert_linear("wait group", g);

        let g = growth(1_000, 10_000, linear, |n| {
            rt.block_on(move || {
                let base = parked();
                let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
                let hs: Vec<_> = (0..n)
                    .map(|_| {
                        let pair = pair.clone();
                        fiber::spawn(move || *pair.1.wait_while(pair.0.lock().unwrap(), |go| !*go).unwrap())
                    })
                    .collect();
                common::wait_until("the waiters to park", 60, || parked() >= base + n);
                let t = Instant::now();
                *pair.0.lock().unwrap() = true;
                pair.1.notify_all();
                for h in hs {
                    assert!(h.join().unwrap());
                }
                t.elapsed()
            })
        });
        assert_linear("condvar notify_all", g);
    });
}

/// Fibers that are parked cost no CPU: 100,000 parked fibers leave an idle
/// runtime idle (under 0.5 s of CPU in 2 s), and a ping-pong next to them
/// runs about as fast as without them.
#[test]
fn parked_fibers_cost_no_cpu_and_do_not_slow_the_others() {
    heavy("parked_fibers_cost_no_cpu_and_do_not_slow_the_others", 300, || {
        const N: usize = 100_000;
        let rt = rt_fixed(2);
        rt.block_on(|| {
            let ping_pong = || {
                let (a_tx, a_rx) = chan::bounded::<u32>(0);
                let (b_tx, b_rx) = chan::bounded::<u32>(0);
                let echo = fiber::spawn(move || {
                    while let Ok(v) = a_rx.recv() {
                        b_tx.send(v).unwrap();
                    }
                });
                let t = Instant::now();
                for i in 0..20_000 {
                    a_tx.send(i).unwrap();
                    assert_eq!(b_rx.recv().unwrap(), i);
                }
                let d = t.elapsed();
                drop(a_tx);
                echo.join().unwrap();
                d
            };
            let alone = ping_pong().min(ping_pong());
            let base = parked();
            let (tx, rx) = chan::bounded::<()>(0);
            let hs: Vec<_> = (0..N)
                .map(|_| {
                    let rx = rx.clone();
                    fiber::spawn(move || {
                        let _ = rx.recv();
                    })
                })
                .collect();
            common::wait_until("the fibers to park", 60, || parked() >= base + N);
            let cpu0 = cpu_time();
            fiber::sleep(Duration::from_secs(2)).unwrap();
            let idle_cpu = cpu_time() - cpu0;
            let crowded = ping_pong().min(ping_pong());
            eprintln!("idle cpu with {N} parked: {idle_cpu:?}; ping-pong alone {alone:?}, next to them {crowded:?}");
            drop(tx);
            for h in hs {
                h.join().unwrap();
            }
            assert!(idle_cpu < ms(500), "{N} parked fibers used {idle_cpu:?} of CPU in 2 s");
            assert!(
                crowded < alone * 3,
                "ping-pong took {crowded:?} next to {N} parked fibers, {alone:?} alone"
            );
        });
    });
}

/// `fiber::dump()` (what `FIBER_DUMP_SIGNAL` prints) with 5,000 against
/// 50,000 parked fibers: linear in the fibers.
#[test]
fn a_dump_of_many_parked_fibers_is_linear() {
    heavy("a_dump_of_many_parked_fibers_is_linear", 300, || {
        let rt = rt_fixed(2);
        let g = growth(5_000, 50_000, linear, |n| {
            rt.block_on(move || {
                let base = parked();
                let (tx, rx) = chan::bounded::<()>(0);
                let hs: Vec<_> = (0..n)
                    .map(|_| {
                        let rx = rx.clone();
                        fiber::spawn(move || {
                            let _ = rx.recv();
                        })
                    })
                    .collect();
                common::wait_until("the fibers to park", 60, || parked() >= base + n);
                let t = Instant::now();
                let text = fiber::dump().to_string();
                let d = t.elapsed();
                let group = format!("{n} fiber(s) parked on chan receive");
                assert!(
                    text.contains(&group),
                    "no '{group}' in the dump:\n{}",
                    &text[..text.len().min(2000)]
                );
                drop(tx);
                for h in hs {
                    h.join().unwrap();
                }
                d
            })
        });
        assert_linear("dump", g);
    });
}

// ---------------------------------------------------------------------------
// 3. Limits
// ---------------------------------------------------------------------------

/// README (W7): a parked fiber costs about 5.6 KiB resident, within an
/// 8 KiB target. 20,000 and then 200,000 fibers parked on a channel: the
/// resident cost per fiber stays within the target (twice it in a debug
/// build, whose frames are larger) and does not grow with the count, and
/// the time to spawn and park them is linear.
#[test]
fn memory_per_parked_fiber_stays_within_the_documented_bound() {
    heavy("memory_per_parked_fiber_stays_within_the_documented_bound", 300, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_workers(2)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        rt.block_on(|| {
            let (tx, rx) = chan::bounded::<()>(0);
            let mut hs = Vec::with_capacity(200_000);
            let mut measure = |n: usize| {
                let before = rss_kib();
                let base = parked();
                let t = Instant::now();
                for _ in 0..n {
                    let rx = rx.clone();
                    hs.push(fiber::spawn(move || {
                        let _ = rx.recv();
                    }));
                }
                common::wait_until("the fibers to park", 120, || parked() >= base + n);
                let d = t.elapsed();
                let per = (rss_kib() - before) as f64 / n as f64;
                (per, d)
            };
            let (per_small, t_small) = measure(20_000);
            let (per_large, t_large) = measure(180_000);
            eprintln!(
                "KiB per parked fiber: {per_small:.2} (20k), {per_large:.2} (next 180k); spawn+park {t_small:?}, {t_large:?}"
            );
            drop(tx);
            for h in hs {
                h.join().unwrap();
            }
            let bound = if cfg!(debug_assertions) { 16.0 } else { 8.0 };
            assert!(per_large < bound, "{per_large:.2} KiB per parked fiber");
            assert!(per_large < per_small * 2.0 + 1.0, "{per_small:.2} then {per_large:.2} KiB per fiber");
            let g = (t_large.as_secs_f64() / 180_000.0) / (t_small.as_secs_f64() / 20_000.0);
            assert!(g < 3.0, "spawn+park per fiber grew {g:.2}x ({t_small:?} for 20k, {t_large:?} for 180k)");
        });
    });
}

/// std: `thread::Builder::new().stack_size(1 << 30)` works (the stack is
/// reserved, not committed). Sixteen fibers with 1 GiB stacks run at once,
/// recursing a little: resident memory stays small.
#[test]
fn one_gib_stacks_are_reserved_not_committed() {
    heavy("one_gib_stacks_are_reserved_not_committed", 120, || {
        let rt = rt_fixed(2);
        rt.block_on(|| {
            let vm0 = vm_kib();
            let rss0 = rss_kib();
            let (tx, rx) = chan::bounded::<()>(0);
            let mut hs = Vec::new();
            for _ in 0..16 {
                let rx = rx.clone();
                let h = fiber::Builder::new()
                    .stack_size(1 << 30)
                    .spawn(move || {
                        let v = recurse_to(2_000);
                        let _ = rx.recv();
                        v
                    })
                    .expect("a 1 GiB stack is within the documented limit");
                hs.push(h);
            }
            common::wait_until("the big fibers to park", 30, || parked() >= 16);
            let (vm1, rss1) = (vm_kib(), rss_kib());
            drop(tx);
            for h in hs {
                assert_eq!(h.join().unwrap(), 1);
            }
            eprintln!("VmSize {vm0} -> {vm1} KiB, RSS {rss0} -> {rss1} KiB");
            assert!(
                vm1 >= vm0 + 15 * 1024 * 1024,
                "16 GiB of stacks were not reserved? {vm0} -> {vm1}"
            );
            assert!(rss1 < rss0 + 256 * 1024, "RSS grew from {rss0} to {rss1} KiB");
        });
    });
}

/// std: a thread's stack is unmapped when the thread ends; Go shrinks
/// goroutine stacks at GC. The docs (fiber::Builder, "Stack size"): a
/// stack above the pool's size is kept for reuse "and unmapped when it
/// trims idle memory"; README: "the runtime's monitor gives back, once a
/// second, the frames and stacks that stayed idle for that whole second".
/// Eight fibers that recurse deep on 64 MiB stacks (the documented use of
/// a big `stack_size`) end; five seconds later their memory must be back.
#[test]
/// Was (before the fix): idle big stacks are not trimmed below the 32-stack watermark: 180 MiB RSS still resident 5 s later
fn deep_recursion_on_big_builder_stacks_gives_its_memory_back_when_idle() {
    heavy(
        "deep_recursion_on_big_builder_stacks_gives_its_memory_back_when_idle",
        120,
        || {
            let rt = rt_fixed(2);
            rt.block_on(|| {
                let (vm0, rss0) = (vm_kib(), rss_kib());
                let hs: Vec<_> = (0..8)
                    .map(|_| {
                        fiber::Builder::new()
                            .stack_size(64 << 20)
                            .spawn(|| recurse_to(40_000))
                            .unwrap()
                    })
                    .collect();
                for h in hs {
                    assert_eq!(h.join().unwrap(), 1);
                }
                let (vm1, rss1) = (vm_kib(), rss_kib());
                let start = Instant::now();
                while rss_kib() > rss0 + 64 * 1024 && start.elapsed() < Duration::from_secs(5) {
                    fiber::sleep(ms(100)).unwrap();
                }
                let (vm2, rss2) = (vm_kib(), rss_kib());
                eprintln!("VmSize {vm0} -> {vm1} -> {vm2} KiB, RSS {rss0} -> {rss1} -> {rss2} KiB");
                assert!(
                    rss1 > rss0 + 64 * 1024,
                    "the recursion did not touch its stacks? RSS {rss0} -> {rss1}"
                );
                assert!(
                    rss2 < rss0 + 64 * 1024,
                    "5 s after eight deep fibers ended, RSS is still {rss2} KiB ({rss0} before; VmSize {vm0} -> {vm2})"
                );
            });
        },
    );
}

/// Builder stacks above the pool's size are mapped per fiber and "guarded
/// like the others": an overflow there prints the documented message and
/// aborts, as in a pool stack (README: "A guard hit prints `fiber <id> has
/// overflowed its stack` and aborts").
#[test]
fn an_overflow_of_a_builder_stack_above_the_pool_size_aborts_with_the_message() {
    let scenario = "an_overflow_of_a_builder_stack_above_the_pool_size_aborts_with_the_message";
    if let Some((status, stderr)) = child_outcome(scenario, 60, || {
        rt_fixed(2).block_on(|| {
            let h = fiber::Builder::new()
                .stack_size(4 << 20)
                .spawn(|| recurse_forever(0))
                .unwrap();
            let _ = h.join();
        });
    }) {
        assert!(!status.success(), "an overflow did not abort");
        assert!(
            stderr.contains("has overflowed its stack"),
            "status {status:?}, stderr:\n{stderr}"
        );
    }
}

/// The root fiber of `block_on` overflowing: same message, abort.
#[test]
fn an_overflow_of_the_root_fiber_aborts_with_the_message() {
    let scenario = "an_overflow_of_the_root_fiber_aborts_with_the_message";
    if let Some((status, stderr)) = child_outcome(scenario, 60, || {
        rt_fixed(1).block_on(|| recurse_forever(0));
    }) {
        assert!(!status.success(), "an overflow did not abort");
        assert!(
            stderr.contains("has overflowed its stack"),
            "status {status:?}, stderr:\n{stderr}"
        );
    }
}

/// A plain std thread (and a blocking-pool thread) that overflows in a
/// process where fiber installed its SIGSEGV handler still gets std's own
/// report: "thread '<name>' has overflowed its stack".
#[test]
fn an_overflow_of_a_plain_thread_still_gets_stds_message() {
    let scenario = "an_overflow_of_a_plain_thread_still_gets_stds_message";
    if let Some((status, stderr)) = child_outcome(scenario, 60, || {
        rt_fixed(1).block_on(|| {
            fiber::spawn(|| recurse_to(10)).join().unwrap();
        });
        let t = std::thread::Builder::new()
            .name("deep-thread".into())
            .stack_size(256 * 1024)
            .spawn(|| recurse_forever(0))
            .unwrap();
        let _ = t.join();
    }) {
        assert!(!status.success(), "an overflow did not abort");
        assert!(
            stderr.contains("thread 'deep-thread'") && stderr.contains("has overflowed its stack"),
            "status {status:?}, stderr:\n{stderr}"
        );
    }
}

#[test]
fn an_overflow_in_a_blocking_call_still_gets_stds_message() {
    let scenario = "an_overflow_in_a_blocking_call_still_gets_stds_message";
    if let Some((status, stderr)) = child_outcome(scenario, 60, || {
        rt_fixed(1).block_on(|| {
            fiber::blocking(|| recurse_forever(0));
        });
    }) {
        assert!(!status.success(), "an overflow did not abort");
        assert!(
            stderr.contains("has overflowed its stack"),
            "status {status:?}, stderr:\n{stderr}"
        );
        assert!(
            !stderr.contains("fiber "),
            "a thread's overflow blamed on a fiber:\n{stderr}"
        );
    }
}

/// trio's test_very_deep_cancel_scope_nesting nests 1,000 cancel scopes;
/// Go code nests `context.WithTimeout` as deep as its call chain. 1,000
/// nested `with_timeout`s and 1,000 nested scopes in one fiber (on an
/// 8 MiB stack, std's main-thread size: in a debug build a level of
/// `with_timeout` takes about 1.6 KiB of stack and a scope 0.9 KiB, so the
/// default 1 MiB stack holds about 650 and 1,200 levels): the outermost,
/// shortest deadline ends them all, promptly.
#[test]
fn a_thousand_nested_with_timeouts_and_scopes_in_one_fiber() {
    heavy("a_thousand_nested_with_timeouts_and_scopes_in_one_fiber", 120, || {
        fn deep_timeouts(d: usize) -> bool {
            if d == 0 {
                return fiber::sleep(Duration::MAX).is_err();
            }
            fiber::with_timeout(Duration::from_secs(100), || deep_timeouts(d - 1)).unwrap_or(true)
        }
        fn deep_scopes(d: usize) -> bool {
            if d == 0 {
                return fiber::sleep(Duration::MAX).is_err();
            }
            fiber::scope(|_| deep_scopes(d - 1))
        }
        rt_fixed(2).block_on(|| {
            let h = fiber::Builder::new()
                .stack_size(8 << 20)
                .spawn(|| {
                    let t = Instant::now();
                    let r = fiber::with_timeout(ms(50), || deep_timeouts(1_000));
                    assert_eq!(r, Err(fiber::TimedOut));
                    let r = fiber::with_timeout(ms(50), || deep_scopes(1_000));
                    assert_eq!(r, Err(fiber::TimedOut));
                    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
                    assert!(fiber::yield_now().is_ok());
                    let s = fiber::stats().runtime;
                    assert!(
                        s.timers_pending <= 4_096,
                        "{} timers left by 1,000 ended with_timeouts",
                        s.timers_pending
                    );
                })
                .unwrap();
            h.join().unwrap();
        });
    });
}

/// std: 20,000 threads with 512 KiB stacks is an ordinary program, and
/// thread exit costs the same however many threads there are. 2,000
/// against 20,000 fibers whose `stack_size` is above the pool's (each gets
/// a guarded mapping of its own, registered for overflow reports) alive at
/// once: ending them costs the same per fiber.
#[test]
/// Was (before the fix): unmapping a big stack scans the guard table up to its high-water mark: 20k fibers end in O(n^2)
fn many_fibers_with_big_stacks_at_once_are_linear() {
    heavy("many_fibers_with_big_stacks_at_once_are_linear", 300, || {
        let rt = rt_fixed(2);
        let measure = |n: usize| {
            rt.block_on(move || {
                let base = parked();
                let (tx, rx) = chan::bounded::<()>(0);
                let hs: Vec<_> = (0..n)
                    .map(|i| {
                        let rx = rx.clone();
                        fiber::Builder::new()
                            .stack_size(512 * 1024)
                            .spawn(move || {
                                let _ = rx.recv();
                                i
                            })
                            .unwrap()
                    })
                    .collect();
                common::wait_until("the fibers to park", 60, || parked() >= base + n);
                // Timed: the fibers ending (their stacks unmapped).
                let t = Instant::now();
                drop(tx);
                for (i, h) in hs.into_iter().enumerate() {
                    assert_eq!(h.join().unwrap(), i);
                }
                t.elapsed()
            })
        };
        // Small sizes first: a large run leaves the guard table's
        // high-water mark up, which slows every later run (see the next test).
        let ts = measure(2_000).min(measure(2_000));
        let tl = measure(20_000);
        let g = ((tl.as_secs_f64() / 20_000.0) / (ts.as_secs_f64() / 2_000.0), ts, tl);
        assert_linear("big-stack fibers", g);
    });
}

/// The cost of a fiber with a big stack must not depend on how many such
/// fibers a program had at some earlier point: 1,000 big-stack fibers
/// spawned, parked and ended, before and after a one-off burst of 20,000.
#[test]
/// Was (before the fix): the guard table's high-water mark never comes down, so every later big-stack unmap scans 20k slots
fn a_past_burst_of_big_stack_fibers_does_not_slow_later_ones() {
    heavy("a_past_burst_of_big_stack_fibers_does_not_slow_later_ones", 300, || {
        let rt = rt_fixed(2);
        let round = |n: usize| {
            rt.block_on(move || {
                let base = parked();
                let (tx, rx) = chan::bounded::<()>(0);
                let t = Instant::now();
                let hs: Vec<_> = (0..n)
                    .map(|_| {
                        let rx = rx.clone();
                        fiber::Builder::new()
                            .stack_size(512 * 1024)
                            .spawn(move || {
                                let _ = rx.recv();
                            })
                            .unwrap()
                    })
                    .collect();
                common::wait_until("the fibers to park", 60, || parked() >= base + n);
                drop(tx);
                for h in hs {
                    h.join().unwrap();
                }
                t.elapsed()
            })
        };
        let before = round(1_000).min(round(1_000));
        round(20_000);
        let after = round(1_000).min(round(1_000));
        eprintln!("1,000 big-stack fibers: {before:?} before a burst of 20,000, {after:?} after");
        assert!(
            after < before * 3,
            "1,000 big-stack fibers took {after:?} after the burst, {before:?} before"
        );
    });
}

/// A server holding many connections open: connections made one after
/// the other, each echoed once and kept open (200 against 2,000 open at
/// the end): the cost per connection does not grow with the number open,
/// and closing them all returns the fd count to where it was.
#[test]
fn many_open_connections_cost_the_same_per_connection_and_close_cleanly() {
    heavy(
        "many_open_connections_cost_the_same_per_connection_and_close_cleanly",
        300,
        || {
            use std::io::{Read, Write};
            let rt = rt_fixed(2);
            let base_fds = std::sync::Mutex::new(None);
            let g = growth(200, 2_000, linear, |n| {
                let d = rt.block_on(|| {
                    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
                    let addr = listener.local_addr().unwrap();
                    let server = fiber::spawn(move || {
                        let mut handlers = Vec::new();
                        for _ in 0..n {
                            let (mut s, _) = listener.accept().unwrap();
                            handlers.push(fiber::spawn(move || {
                                let mut b = [0u8; 4];
                                s.read_exact(&mut b).unwrap();
                                s.write_all(&b).unwrap();
                                // Then wait for the client to close.
                                assert_eq!(s.read(&mut b).unwrap(), 0);
                            }));
                        }
                        for h in handlers {
                            h.join().unwrap();
                        }
                    });
                    let t = Instant::now();
                    let mut open = Vec::new();
                    for i in 0..n as u32 {
                        let mut c = fiber::net::TcpStream::connect(addr).unwrap();
                        c.write_all(&i.to_le_bytes()).unwrap();
                        let mut b = [0u8; 4];
                        c.read_exact(&mut b).unwrap();
                        assert_eq!(u32::from_le_bytes(b), i);
                        open.push(c);
                    }
                    let d = t.elapsed();
                    drop(open);
                    server.join().unwrap();
                    d
                });
                let mut base = base_fds.lock().unwrap();
                let now = fd_count();
                match *base {
                    None => *base = Some(now),
                    Some(b) => assert!(
                        now <= b + 2,
                        "{now} fds open after closing every connection, {b} after the first round"
                    ),
                }
                d
            });
            assert_linear("open connections", g);
        },
    );
}

/// `spawn_blocking` in a loop: 20,000 short blocking calls one after the
/// other reuse the pool's threads (the thread count stays small).
#[test]
fn twenty_thousand_sequential_blocking_calls_reuse_threads() {
    heavy("twenty_thousand_sequential_blocking_calls_reuse_threads", 120, || {
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        rt_fixed(2).block_on(|| {
            let before = threads();
            let mut max = before;
            for i in 0..20_000u64 {
                assert_eq!(fiber::blocking(move || i * 2), i * 2);
                if i % 100 == 0 {
                    max = max.max(threads());
                }
            }
            eprintln!("threads {before} -> max {max}");
            assert!(
                max <= before + 4,
                "{max} threads for sequential blocking calls ({before} before)"
            );
        });
    });
}
