use crate::common::*;

// Review 44: fairness against "never-parking" fibers. A fiber whose blocking
// operations always succeed at once never reaches a park; on a fixed pool it
// holds its worker unless the runtime makes such operations yield points now
// and then (tokio's coop budget forces a yield after 128 resource operations;
// Go preempts). Each test runs one fiber (the hog) in a loop of one operation
// that always succeeds at once, and measures how long a sibling that needs the
// same worker (a fiber spawned there, a 10 ms sleeper, a socket read woken by
// the poller) waits for its turn. The hog stops on a flag the test thread sets
// after the limit, so a failing test ends (and the runtime drops) cleanly.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a sibling may wait for its turn (generous for a loaded 2-core box).
const LIMIT: Duration = Duration::from_secs(2);

/// One round of a hog's loop; owns whatever state the operation needs.
type Op = Box<dyn FnMut() + Send>;

/// What must make progress beside the hogs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sibling {
    /// A fiber spawned by the last hog from inside its loop (its worker's
    /// runnext slot), which only sets a flag.
    Spawned,
    /// A fiber parked in `fiber::sleep(10 ms)` before the hogs start.
    Sleeper,
    /// A fiber parked in a socket read before the hogs start; a plain
    /// thread writes its byte once they run.
    IoWake,
}

struct Outcome {
    /// How long after the hogs ran the sibling finished; `None` if not
    /// within [`LIMIT`].
    sibling_after: Option<Duration>,
    /// Rounds each hog made.
    rounds: Vec<u64>,
}

/// On a fixed pool of `workers` (growth off), run `hogs` fibers, each
/// looping on the operation `make` builds for it until the test stops them,
/// and measure how long `sibling` waits for its turn.
fn sibling_beside_hogs(
    workers: usize,
    hogs: usize,
    sibling: Sibling,
    make: impl Fn(&Arc<AtomicBool>) -> Op + Send + 'static,
) -> Outcome {
    within(40, move || {
        let rt = rt_fixed_grace(workers, ms(300));
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let mut writer = None;
        match sibling {
            Sibling::Spawned => {}
            Sibling::Sleeper => {
                let done = done.clone();
                rt.spawn(move || {
                    fiber::sleep(ms(10)).unwrap();
                    done.store(true, SeqCst);
                });
                wait_parked(&rt, 1);
            }
            Sibling::IoWake => {
                let (mine, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
                let done = done.clone();
                rt.spawn(move || {
                    let mut s = fiber::net::unix::UnixStream::from_std(mine).unwrap();
                    let mut b = [0u8; 1];
                    assert_eq!(s.read(&mut b).unwrap(), 1);
                    done.store(true, SeqCst);
                });
                wait_parked(&rt, 1);
                writer = Some(theirs);
            }
        }
        let started = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for i in 0..hogs {
            let mut op = make(&stop);
            let (s, st, d) = (stop.clone(), started.clone(), done.clone());
            let spawns_sibling = sibling == Sibling::Spawned && i == hogs - 1;
            handles.push(rt.spawn(move || {
                // A first round before anything else is queued: lazy set-up
                // (a socket's registration) that parks must not count as
                // the loop's yield.
                op();
                st.fetch_add(1, SeqCst);
                if spawns_sibling {
                    fiber::spawn(move || d.store(true, SeqCst));
                }
                let mut rounds = 0u64;
                while !s.load(SeqCst) {
                    op();
                    rounds += 1;
                }
                rounds
            }));
            let t = Instant::now();
            while started.load(SeqCst) <= i {
                assert!(t.elapsed() < Duration::from_secs(10), "hog {i} never started");
                std::thread::sleep(ms(1));
            }
        }
        if let Some(mut w) = writer.take() {
            w.write_all(b"x").unwrap();
            writer = Some(w);
        }
        let t = Instant::now();
        let mut sibling_after = None;
        while t.elapsed() < LIMIT {
            if done.load(SeqCst) {
                sibling_after = Some(t.elapsed());
                break;
            }
            std::thread::sleep(ms(1));
        }
        stop.store(true, SeqCst);
        let rounds: Vec<u64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        drop(writer);
        drop(rt);
        Outcome { sibling_after, rounds }
    })
}

/// `sibling_beside_hogs` and the assertion every test makes: the sibling
/// had its turn within [`LIMIT`] while each hog kept looping.
fn assert_sibling_runs(
    what: &str,
    workers: usize,
    hogs: usize,
    sibling: Sibling,
    make: impl Fn(&Arc<AtomicBool>) -> Op + Send + 'static,
) {
    let out = sibling_beside_hogs(workers, hogs, sibling, make);
    assert!(out.rounds.iter().all(|&r| r > 0), "{what}: a hog made no round");
    assert!(
        out.sibling_after.is_some(),
        "{what}: the {sibling:?} sibling on {workers} worker(s) beside {hogs} hog(s) got no turn in {LIMIT:?} \
         (hog rounds {:?})",
        out.rounds
    );
}

fn one_worker(what: &str, make: impl Fn(&Arc<AtomicBool>) -> Op + Send + 'static) {
    assert_sibling_runs(what, 1, 1, Sibling::Spawned, make);
}

/// A bounded(1) channel holding one message that the hog takes and puts
/// back: its `recv` and `send` always succeed at once, with no other party.
fn self_fed(cap: usize) -> (fiber::chan::Sender<u64>, fiber::chan::Receiver<u64>) {
    let (tx, rx) = if cap == usize::MAX {
        fiber::chan::unbounded()
    } else {
        fiber::chan::bounded(cap)
    };
    tx.send(7).unwrap();
    (tx, rx)
}

/// A short spin (no yield point) so that a plain thread on the other end
/// of a channel or socket keeps up with the hog.
fn pace() {
    load::spin(Duration::from_micros(20));
}

// ---------------------------------------------------------------------------
// Operations that are yield points: the sibling runs (these pass).

#[test]
fn sleep_zero_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("sleep(ZERO)", |_| Box::new(|| fiber::sleep(Duration::ZERO).unwrap()));
}

#[test]
fn sleep_until_the_past_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("sleep_until(past)", |_| {
        let past = Instant::now();
        Box::new(move || fiber::sleep_until(past).unwrap())
    });
}

#[test]
fn yield_now_in_a_loop_lets_a_sleeper_and_an_io_wake_run_one_worker() {
    assert_sibling_runs("yield_now", 1, 1, Sibling::Sleeper, |_| {
        Box::new(|| fiber::yield_now().unwrap())
    });
    assert_sibling_runs("yield_now", 1, 1, Sibling::IoWake, |_| {
        Box::new(|| fiber::yield_now().unwrap())
    });
}

#[test]
fn with_timeout_of_a_closure_that_returns_at_once_lets_a_sibling_run_one_worker() {
    // The watchdog fiber it spawns and joins makes a runnext chain, which
    // has a 10 ms slice.
    one_worker("with_timeout(1 s, || 1)", |_| {
        Box::new(|| assert_eq!(fiber::with_timeout(Duration::from_secs(1), || 1), Ok(1)))
    });
}

#[test]
fn spawn_and_join_in_a_loop_lets_a_sleeper_run_one_worker() {
    assert_sibling_runs("spawn + join", 1, 1, Sibling::Sleeper, |_| {
        Box::new(|| assert_eq!(fiber::spawn(|| 3).join().unwrap(), 3))
    });
}

#[test]
fn condvar_wait_timeout_zero_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("Condvar::wait_timeout(ZERO)", |_| {
        let pair = Arc::new((fiber::sync::Mutex::new(0u32), fiber::sync::Condvar::new()));
        Box::new(move || {
            let (m, cv) = &*pair;
            let g = m.lock().unwrap();
            let (_g, r) = cv.wait_timeout(g, Duration::ZERO).unwrap();
            assert!(r.timed_out());
        })
    });
}

#[test]
fn a_due_after_zero_received_in_a_loop_lets_a_sleeper_run_one_worker() {
    assert_sibling_runs("after(ZERO).recv()", 1, 1, Sibling::Sleeper, |_| {
        Box::new(|| {
            fiber::chan::after(Duration::ZERO).recv().unwrap();
        })
    });
}

#[test]
fn a_tick_of_a_tiny_period_received_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("tick(1 us).recv()", |_| {
        let t = fiber::chan::tick(Duration::from_micros(1));
        Box::new(move || {
            t.recv().unwrap();
        })
    });
}

#[test]
fn a_select_taking_a_due_after_arm_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("select! over a due after(ZERO)", |_| {
        let (tx, rx) = fiber::chan::bounded::<u64>(1);
        Box::new(move || {
            let _keep = &tx;
            fiber::select! {
                recv(rx) -> _ => unreachable!(),
                recv(fiber::chan::after(Duration::ZERO)) -> at => { at.unwrap(); }
            }
        })
    });
}

#[test]
fn a_zero_recv_timeout_on_an_empty_channel_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("recv_timeout(ZERO) on empty", |_| {
        let (tx, rx) = fiber::chan::bounded::<u64>(1);
        Box::new(move || {
            let _keep = &tx;
            assert!(rx.recv_timeout(Duration::ZERO).is_err());
        })
    });
}

#[test]
fn blocking_of_an_empty_closure_in_a_loop_lets_a_sibling_run_one_worker() {
    one_worker("blocking(|| ())", |_| Box::new(|| fiber::blocking(|| ())));
}

#[test]
fn a_hog_on_one_of_two_workers_does_not_starve_a_sibling_queued_behind_it() {
    // The monitor's rescue moves the sibling out of the hog's runnext slot
    // to the global queue, where the other worker takes it.
    assert_sibling_runs("uncontended Mutex::lock, 2 workers", 2, 1, Sibling::Spawned, |_| {
        let m = fiber::sync::Mutex::new(0u64);
        Box::new(move || *m.lock().unwrap() += 1)
    });
}

#[test]
fn a_hog_on_one_of_two_workers_does_not_keep_a_sleeper_or_an_io_wake_waiting() {
    for sibling in [Sibling::Sleeper, Sibling::IoWake] {
        assert_sibling_runs("self-fed recv + send, 2 workers", 2, 1, sibling, |_| {
            let (tx, rx) = self_fed(1);
            Box::new(move || tx.send(rx.recv().unwrap()).unwrap())
        });
    }
}

#[test]
fn a_hog_looping_on_yield_now_is_stopped_by_shutdown_promptly_one_worker() {
    // Control for the shutdown tests below: a yield point is a
    // cancellation point, so a drop ends such a loop within the grace.
    within(30, || {
        let rt = rt_fixed_grace(1, ms(300));
        let rounds = Arc::new(AtomicU64::new(0));
        let r = rounds.clone();
        rt.spawn(move || {
            while fiber::yield_now().is_ok() {
                r.fetch_add(1, SeqCst);
            }
        });
        while rounds.load(SeqCst) == 0 {
            std::thread::sleep(ms(1));
        }
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(2), "drop took {:?}", t.elapsed());
    });
}

// ---------------------------------------------------------------------------
// Channel operations that succeed at once: no yield point (README
// "Cooperative": "An operation that succeeds at once ... does not yield").

#[test]
// Failed before the fix: a fiber looping recv+send on a bounded(1) channel it keeps fed starves a sibling on 1 worker
fn bounded_recv_and_send_that_always_succeed_let_a_sibling_run_one_worker() {
    one_worker("self-fed bounded(1) recv + send", |_| {
        let (tx, rx) = self_fed(1);
        Box::new(move || tx.send(rx.recv().unwrap()).unwrap())
    });
}

#[test]
// Failed before the fix: recv of a bounded channel a plain thread keeps non-empty never yields (1 worker)
fn recv_from_a_bounded_channel_a_thread_keeps_full_lets_a_sibling_run_one_worker() {
    one_worker("bounded(4096) recv fed by a thread", |_| {
        let (tx, rx) = fiber::chan::bounded::<u64>(4096);
        for i in 0..4096 {
            tx.send(i).unwrap();
        }
        std::thread::spawn(move || while tx.send(1).is_ok() {});
        Box::new(move || {
            rx.recv().unwrap();
            pace();
        })
    });
}

#[test]
// Failed before the fix: recv of an unbounded channel a plain thread keeps non-empty never yields (1 worker)
fn recv_from_an_unbounded_channel_a_thread_keeps_filled_lets_a_sibling_run_one_worker() {
    one_worker("unbounded recv fed by a thread", |_| {
        let (tx, rx) = fiber::chan::unbounded::<u64>();
        for i in 0..200_000 {
            tx.send(i).unwrap();
        }
        std::thread::spawn(move || loop {
            if tx.len() < 100_000 {
                for i in 0..10_000 {
                    if tx.send(i).is_err() {
                        return;
                    }
                }
            } else if tx.send(0).is_err() {
                return;
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        Box::new(move || {
            rx.recv().unwrap();
            pace();
        })
    });
}

#[test]
// Failed before the fix: recv on a rendezvous channel from plain-thread senders parked in send never yields (1 worker)
fn recv_from_a_rendezvous_channel_with_parked_thread_senders_lets_a_sibling_run_one_worker() {
    one_worker("rendezvous recv from parked thread senders", |_| {
        let (tx, rx) = fiber::chan::bounded::<u64>(0);
        for _ in 0..8 {
            let tx = tx.clone();
            std::thread::spawn(move || while tx.send(1).is_ok() {});
        }
        Box::new(move || {
            rx.recv().unwrap();
            load::spin(Duration::from_micros(500));
        })
    });
}

#[test]
// Failed before the fix: send into an unbounded channel a thread drains never yields (1 worker)
fn send_into_an_unbounded_channel_a_thread_drains_lets_a_sibling_run_one_worker() {
    one_worker("unbounded send drained by a thread", |_| {
        let (tx, rx) = fiber::chan::unbounded::<u64>();
        std::thread::spawn(move || while rx.recv().is_ok() {});
        Box::new(move || tx.send(1).unwrap())
    });
}

#[test]
// Failed before the fix: a successful try_recv (+ try_send) never counts toward the poll budget (1 worker)
fn try_recv_that_always_succeeds_lets_a_sibling_run_one_worker() {
    one_worker("self-fed try_recv + try_send", |_| {
        let (tx, rx) = self_fed(1);
        Box::new(move || tx.try_send(rx.try_recv().unwrap()).unwrap())
    });
}

#[test]
// Failed before the fix: recv_timeout that finds a message (and iter().next()) never yields (1 worker)
fn recv_timeout_and_iter_that_always_succeed_let_a_sibling_run_one_worker() {
    one_worker("self-fed unbounded recv_timeout + iter", |_| {
        let (tx, rx) = self_fed(usize::MAX);
        Box::new(move || {
            let v = rx.recv_timeout(Duration::from_secs(1)).unwrap();
            tx.send(v).unwrap();
            let v = rx.iter().next().unwrap();
            tx.send(v).unwrap();
        })
    });
}

#[test]
// Failed before the fix: a select! whose recv arm is always ready never yields (1 worker)
fn select_with_an_always_ready_arm_lets_a_sibling_run_one_worker() {
    one_worker("select! over a self-fed channel", |_| {
        let (tx, rx) = self_fed(1);
        let (idle_tx, idle) = fiber::chan::bounded::<u64>(1);
        Box::new(move || {
            let _keep = &idle_tx;
            fiber::select! {
                recv(rx) -> v => tx.send(v.unwrap()).unwrap(),
                recv(idle) -> _ => unreachable!(),
            }
        })
    });
}

// ---------------------------------------------------------------------------
// fiber::sync operations that succeed at once.

#[test]
// Failed before the fix: an uncontended Mutex::lock in a loop starves a sibling on 1 worker
fn uncontended_mutex_lock_lets_a_sibling_run_one_worker() {
    one_worker("uncontended Mutex::lock", |_| {
        let m = fiber::sync::Mutex::new(0u64);
        Box::new(move || *m.lock().unwrap() += 1)
    });
}

#[test]
// Failed before the fix: an uncontended Mutex::lock loop keeps a 10 ms sleeper of the same worker asleep for ever (1 worker)
fn uncontended_mutex_lock_lets_a_sleeper_wake_one_worker() {
    assert_sibling_runs("uncontended Mutex::lock", 1, 1, Sibling::Sleeper, |_| {
        let m = fiber::sync::Mutex::new(0u64);
        Box::new(move || *m.lock().unwrap() += 1)
    });
}

#[test]
// Failed before the fix: an uncontended Mutex::lock loop keeps a fiber woken by socket readiness from running (1 worker)
fn uncontended_mutex_lock_lets_an_io_wake_run_one_worker() {
    assert_sibling_runs("uncontended Mutex::lock", 1, 1, Sibling::IoWake, |_| {
        let m = fiber::sync::Mutex::new(0u64);
        Box::new(move || *m.lock().unwrap() += 1)
    });
}

#[test]
// Failed before the fix: two lock hogs on two workers starve a sleeper for ever (the rescue has nowhere to go)
fn two_mutex_lock_hogs_let_a_sleeper_wake_two_workers() {
    assert_sibling_runs("uncontended Mutex::lock, 2 hogs", 2, 2, Sibling::Sleeper, |_| {
        let m = fiber::sync::Mutex::new(0u64);
        Box::new(move || *m.lock().unwrap() += 1)
    });
}

#[test]
// Failed before the fix: uncontended RwLock read/write in a loop starves a sibling on 1 worker
fn uncontended_rwlock_read_and_write_let_a_sibling_run_one_worker() {
    one_worker("uncontended RwLock read + write", |_| {
        let l = fiber::sync::RwLock::new(0u64);
        Box::new(move || {
            let v = *l.read().unwrap();
            *l.write().unwrap() = v + 1;
        })
    });
}

#[test]
// Failed before the fix: Semaphore::acquire with a free permit in a loop starves a sibling on 1 worker
fn semaphore_acquire_with_a_free_permit_lets_a_sibling_run_one_worker() {
    one_worker("Semaphore::acquire", |_| {
        let s = fiber::sync::Semaphore::new(1);
        Box::new(move || drop(s.acquire().unwrap()))
    });
}

#[test]
// Failed before the fix: OnceLock::get_or_init of a set lock, Barrier(1)::wait and an empty WaitGroup::wait never yield (1 worker)
fn once_lock_barrier_of_one_and_empty_wait_group_let_a_sibling_run_one_worker() {
    one_worker("OnceLock::get_or_init + Barrier(1) + WaitGroup", |_| {
        let once = fiber::sync::OnceLock::new();
        let barrier = fiber::sync::Barrier::new(1);
        Box::new(move || {
            assert_eq!(*once.get_or_init(|| 5u64), 5);
            barrier.wait();
            fiber::sync::WaitGroup::new().wait();
        })
    });
}

// ---------------------------------------------------------------------------
// Jobs and parking that complete at once.

#[test]
// Failed before the fix: Job::join of an ended job (a cancellation point) is no yield point (1 worker)
fn job_join_of_a_finished_job_lets_a_sibling_run_one_worker() {
    one_worker("Job::join of a finished job", |_| {
        let job = std::sync::Mutex::new(None);
        Box::new(move || {
            let mut job = job.lock().unwrap();
            let j = job.get_or_insert_with(|| {
                let h = fiber::spawn(fiber::Job::current);
                let j = h.join().unwrap();
                j.join().unwrap();
                j
            });
            assert!(j.join().is_ok());
        })
    });
}

#[test]
// Failed before the fix: fiber::scope with no children (and with_timeout(ZERO)) never yields (1 worker)
fn an_empty_scope_lets_a_sibling_run_one_worker() {
    one_worker("scope(|_| ()) + with_timeout(ZERO)", |_| {
        Box::new(|| {
            fiber::scope(|_| ());
            assert!(fiber::with_timeout(Duration::ZERO, || ()).is_err());
        })
    });
}

#[test]
// Failed before the fix: park() with an unpark token already set returns without yielding (1 worker)
fn park_with_a_pending_unpark_lets_a_sibling_run_one_worker() {
    one_worker("unpark + park", |_| {
        Box::new(|| {
            fiber::current().unpark();
            fiber::park();
        })
    });
}

// ---------------------------------------------------------------------------
// fiber::net operations that succeed at once.

/// A connected loopback TCP pair: the fiber's end (std, registered on its
/// first use in the fiber) and the thread's end. Loopback TCP buffers grow to
/// megabytes, so a paced fiber never drains (or fills) them.
fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (l.accept().unwrap().0, c)
}

#[test]
// Failed before the fix: reads of a socket a thread keeps full never yield (1 worker)
fn reads_of_a_socket_that_always_has_data_let_a_sibling_run_one_worker() {
    one_worker("TcpStream read with data", |_| {
        let (mine, mut theirs) = tcp_pair();
        let written = Arc::new(AtomicU64::new(0));
        let w = written.clone();
        std::thread::spawn(move || {
            let buf = [1u8; 65536];
            while theirs.write_all(&buf).is_ok() {
                w.fetch_add(buf.len() as u64, SeqCst);
            }
        });
        // The buffers hold a good backlog before the first read.
        while written.load(SeqCst) < 1 << 20 {
            std::thread::sleep(ms(1));
        }
        let mut s = Some(mine);
        let mut stream = None;
        Box::new(move || {
            let st = stream.get_or_insert_with(|| fiber::net::TcpStream::from_std(s.take().unwrap()).unwrap());
            let mut b = [0u8; 16];
            assert_eq!(st.read(&mut b).unwrap(), 16);
            pace();
        })
    });
}

#[test]
// Failed before the fix: writes to a socket a thread keeps draining never yield (1 worker)
fn writes_to_a_socket_a_thread_drains_let_a_sibling_run_one_worker() {
    one_worker("TcpStream write with room", |_| {
        let (mine, mut theirs) = tcp_pair();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while matches!(theirs.read(&mut buf), Ok(n) if n > 0) {}
        });
        let mut s = Some(mine);
        let mut stream = None;
        Box::new(move || {
            let st = stream.get_or_insert_with(|| fiber::net::TcpStream::from_std(s.take().unwrap()).unwrap());
            assert_eq!(st.write(&[1u8; 64]).unwrap(), 64);
            pace();
        })
    });
}

#[test]
// Failed before the fix: accept with a backlog a thread keeps non-empty never yields (1 worker)
fn accept_with_a_non_empty_backlog_lets_a_sibling_run_one_worker() {
    one_worker("TcpListener::accept with a backlog", |_| {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        let connected = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let (c, a) = (connected.clone(), accepted.clone());
        // Keeps about 64 connections in the backlog (below its cap: an
        // overflowing backlog drops SYNs, and the retry takes a second).
        std::thread::spawn(move || {
            let mut clients = std::collections::VecDeque::new();
            while Arc::strong_count(&a) > 1 {
                if c.load(SeqCst) - a.load(SeqCst) < 64 {
                    let Ok(client) = std::net::TcpStream::connect(addr) else {
                        return;
                    };
                    clients.push_back(client);
                    c.fetch_add(1, SeqCst);
                    if clients.len() > 256 {
                        clients.pop_front();
                    }
                } else {
                    std::thread::yield_now();
                }
            }
        });
        while connected.load(SeqCst) < 64 {
            std::thread::sleep(ms(1));
        }
        let mut l = Some(std_listener);
        let mut listener = None;
        Box::new(move || {
            let l = listener.get_or_insert_with(|| fiber::net::TcpListener::from_std(l.take().unwrap()).unwrap());
            drop(l.accept().unwrap());
            accepted.fetch_add(1, SeqCst);
            load::spin(ms(1));
        })
    });
}

// ---------------------------------------------------------------------------
// Cancellation and shutdown of a fiber whose operations always succeed.

#[test]
// Failed before the fix: JoinHandle::cancel never stops a loop of recvs that always find a message (channel ops are "cancellation points")
fn cancel_stops_a_loop_of_successful_recvs_two_workers() {
    within(30, || {
        let rt = rt_fixed_grace(2, ms(300));
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let (s, r) = (stop.clone(), rounds.clone());
        let h = rt.spawn(move || {
            let (tx, rx) = self_fed(1);
            // Ends on the first failed receive (what a cancelled one gives).
            while let Ok(v) = rx.recv() {
                r.fetch_add(1, SeqCst);
                if s.load(SeqCst) {
                    return "stopped by the flag";
                }
                tx.send(v).unwrap();
            }
            "ended by the cancellation"
        });
        while rounds.load(SeqCst) == 0 {
            std::thread::sleep(ms(1));
        }
        h.cancel();
        let t = Instant::now();
        while !h.is_finished() && t.elapsed() < LIMIT {
            std::thread::sleep(ms(1));
        }
        let still_running = !h.is_finished();
        stop.store(true, SeqCst);
        let how = h.join();
        drop(rt);
        assert!(
            !still_running,
            "the cancelled fiber kept looping for {LIMIT:?} ({how:?})"
        );
    });
}

#[test]
// Failed before the fix: dropping a 1-worker runtime whose fiber loops on an uncontended lock takes grace + 2 s and leaves the worker spinning
fn dropping_the_runtime_stops_a_loop_of_uncontended_locks_one_worker() {
    in_child(
        "dropping_the_runtime_stops_a_loop_of_uncontended_locks_one_worker",
        30,
        || {
            let rt = rt_fixed_grace(1, ms(300));
            let rounds = Arc::new(AtomicU64::new(0));
            let r = rounds.clone();
            rt.spawn(move || {
                let m = fiber::sync::Mutex::new(0u64);
                loop {
                    *m.lock().unwrap() += 1;
                    r.fetch_add(1, SeqCst);
                }
            });
            while rounds.load(SeqCst) == 0 {
                std::thread::sleep(ms(1));
            }
            let t = Instant::now();
            drop(rt);
            let took = t.elapsed();
            let after = rounds.load(SeqCst);
            std::thread::sleep(ms(100));
            let still = rounds.load(SeqCst) - after;
            assert!(
                took < Duration::from_secs(2) && still == 0,
                "the drop took {took:?} and the fiber made {still} more rounds after it"
            );
        },
    );
}
