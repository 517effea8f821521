//! Review 7: realistic first-day programs, written the way a Go / tokio /
//! crossbeam / std::thread user would write them from README.md and the
//! rustdoc alone, with assertions on what that user would expect.
//!
//! Each test is one small program: a chat server, a worker pool, a
//! cancellable pipeline, a select!-based fan-in, Kotlin-style structured
//! concurrency, threads talking to fibers, a keep-alive request/response
//! server with socket timeouts, a rate limiter / debouncer, a cache and a
//! bounded crawler.

use crate::common::{ms, within};
use fiber::chan::{self, Receiver, Sender};
use fiber::net::{TcpListener, TcpStream};
use fiber::select;
use fiber::sync::{Condvar, Mutex, OnceLock, RwLock, Semaphore, WaitGroup};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A 2-worker runtime with a short shutdown grace.
fn rt() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .shutdown_timeout(ms(500))
        .build()
        .unwrap()
}

/// Wait (in a fiber) until only `n` fibers are alive, or fail with a dump.
fn settle_to(n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive = fiber::stats().runtime.fibers_alive;
        if alive <= n {
            assert_eq!(alive, n, "fewer fibers than expected:\n{}", fiber::dump());
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{alive} fibers left, expected {n}:\n{}",
            fiber::dump()
        );
        fiber::sleep(ms(5)).unwrap();
    }
}

// ---------------------------------------------------------------------------
// 1. A TCP chat server: join/leave, fan-out through per-client bounded
//    outboxes with try_send (a slow client is kicked, never blocks the hub),
//    shutdown on a signal channel closes every connection and every fiber
//    ends.
// ---------------------------------------------------------------------------

enum Event {
    Join(u64, Sender<Arc<str>>),
    Leave(u64),
    Msg(u64, String),
}

fn chat_hub(events: Receiver<Event>, shutdown: Receiver<()>, kicked: Arc<AtomicUsize>) {
    let mut clients: HashMap<u64, Sender<Arc<str>>> = HashMap::new();
    loop {
        select! {
            recv(events) -> ev => match ev {
                Ok(Event::Join(id, outbox)) => { clients.insert(id, outbox); }
                Ok(Event::Leave(id)) => { clients.remove(&id); }
                Ok(Event::Msg(from, text)) => {
                    let line: Arc<str> = format!("{from}: {text}\n").into();
                    clients.retain(|_, outbox| match outbox.try_send(line.clone()) {
                        Ok(()) => true,
                        Err(e) if e.is_full() => { kicked.fetch_add(1, Ordering::SeqCst); false }
                        Err(_) => false,
                    });
                }
                Err(_) => break,
            },
            recv(shutdown) -> _ => break,
        }
    }
    // Dropping every outbox makes every writer shut its socket down.
}

fn chat_conn<'scope, 'env>(s: &'scope fiber::Scope<'scope, 'env>, id: u64, stream: TcpStream, events: Sender<Event>) {
    let (outbox_tx, outbox_rx) = chan::bounded::<Arc<str>>(64);
    if events.send(Event::Join(id, outbox_tx)).is_err() {
        return;
    }
    // Go's net sets TCP_NODELAY by default; std (and fiber::net) do not.
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    s.spawn(move || {
        for line in outbox_rx.iter() {
            if writer.write_all(line.as_bytes()).is_err() {
                break;
            }
        }
        // Hub gone or we were kicked: close the connection both ways, which
        // also ends this client's reader below.
        let _ = writer.shutdown(Shutdown::Both);
    });
    s.spawn(move || {
        let reader = BufReader::new(stream);
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if events.send(Event::Msg(id, line)).is_err() {
                return;
            }
        }
        let _ = events.send(Event::Leave(id));
    });
}

#[test]
fn chat_server_fans_out_kicks_a_slow_client_and_shuts_down_cleanly() {
    within(60, || {
        rt().block_on(|| {
            let baseline = fiber::stats().runtime.fibers_alive;
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let (shutdown_tx, shutdown_rx) = chan::bounded::<()>(0);
            let kicked = Arc::new(AtomicUsize::new(0));
            let big = "x".repeat(4000) + "\n";
            const MSGS: usize = 3000;

            fiber::scope(|s| {
                let (events_tx, events_rx) = chan::unbounded::<Event>();
                let k = kicked.clone();
                s.spawn(move || chat_hub(events_rx, shutdown_rx, k));
                let acceptor = s.spawn(move || {
                    let mut next_id = 0;
                    loop {
                        let Ok((stream, _)) = listener.accept() else { break };
                        next_id += 1;
                        chat_conn(s, next_id, stream, events_tx.clone());
                    }
                });

                // Two well-behaved readers and one client that never reads.
                let mut fast: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
                let slow = TcpStream::connect(addr).unwrap();
                let mut talker = TcpStream::connect(addr).unwrap();
                talker.set_nodelay(true).unwrap();
                let mut talker_in = BufReader::new(talker.try_clone().unwrap());
                // Everyone has joined once the talker's hello comes back to a fast client.
                talker.write_all(b"hello\n").unwrap();
                let mut readers: Vec<_> = fast
                    .iter_mut()
                    .map(|c| BufReader::new(c.try_clone().unwrap()))
                    .collect();
                for r in readers.iter_mut().chain(std::iter::once(&mut talker_in)) {
                    let mut line = String::new();
                    loop {
                        line.clear();
                        r.read_line(&mut line).unwrap();
                        if line.ends_with(": hello\n") {
                            break;
                        }
                    }
                }

                // A reader fiber per fast client counts what it gets while the
                // talker floods, and reports every 8 lines (the clients ack).
                let (ack_tx, ack_rx) = chan::unbounded::<()>();
                let counts: Vec<_> = readers
                    .into_iter()
                    .map(|mut r| {
                        let ack_tx = ack_tx.clone();
                        s.spawn(move || {
                            let mut n = 0;
                            let mut line = String::new();
                            while n < MSGS {
                                line.clear();
                                if r.read_line(&mut line).unwrap() == 0 {
                                    break;
                                }
                                if line.contains(": x") {
                                    n += 1;
                                    if n % 8 == 0 {
                                        let _ = ack_tx.send(());
                                    }
                                }
                            }
                            n
                        })
                    })
                    .collect();
                let started = Instant::now();
                // A chat client: send a few lines, then wait for their echoes.
                let mut line = String::new();
                for _ in 0..MSGS / 8 {
                    for _ in 0..8 {
                        talker.write_all(big.as_bytes()).unwrap();
                    }
                    for _ in 0..8 {
                        line.clear();
                        assert!(
                            talker_in.read_line(&mut line).unwrap() > 0,
                            "the talker was disconnected"
                        );
                    }
                    // Both fast clients got the batch.
                    for _ in 0..2 {
                        ack_rx
                            .recv_timeout(Duration::from_secs(10))
                            .expect("a fast client stopped receiving");
                    }
                }
                let got: Vec<usize> = counts.into_iter().map(|h| h.join().unwrap()).collect();
                assert_eq!(got, vec![MSGS, MSGS], "a fast client lost messages");
                assert!(started.elapsed() < Duration::from_secs(20));
                assert!(
                    kicked.load(Ordering::SeqCst) >= 1,
                    "the slow client was never kicked (it would block the hub)"
                );

                // The slow client was disconnected: draining it ends with EOF.
                let mut slow = slow;
                slow.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut sink = Vec::new();
                slow.read_to_end(&mut sink)
                    .expect("the kicked client sees EOF, not a timeout");

                // Shutdown: the hub ends, every writer shuts its socket, every
                // reader sees EOF; the acceptor is cancelled out of accept().
                drop(shutdown_tx);
                for c in fast.iter_mut() {
                    let mut rest = Vec::new();
                    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    c.read_to_end(&mut rest).expect("server closed the connection");
                }
                acceptor.cancel();
                let err = acceptor.join().unwrap_err();
                assert!(err.is_cancelled(), "{err}");
                drop(talker);
            });
            settle_to(baseline);
        });
    });
}

// ---------------------------------------------------------------------------
// 2. A worker pool: jobs on a bounded channel, results on another, graceful
//    shutdown by dropping the sender, per-job timeout, panicking jobs.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Work {
    Square(u64),
    Slow(u64),
    Explode(u64),
}

#[derive(Debug, PartialEq)]
enum Outcome {
    Done(u64, u64),
    TimedOut(u64),
    Panicked(u64, String),
}

fn run_job(w: Work) -> Result<u64, fiber::Cancelled> {
    match w {
        Work::Square(n) => {
            fiber::sleep(ms(1))?;
            Ok(n * n)
        }
        Work::Slow(n) => {
            // Way past the per-job timeout; sleep is a cancellation point.
            fiber::sleep(Duration::from_secs(30))?;
            Ok(n)
        }
        Work::Explode(n) => panic!("job {n} exploded"),
    }
}

#[test]
fn worker_pool_with_timeouts_panics_and_graceful_shutdown() {
    within(60, || {
        rt().block_on(|| {
            let baseline = fiber::stats().runtime.fibers_alive;
            let (jobs_tx, jobs_rx) = chan::bounded::<Work>(8);
            let (res_tx, res_rx) = chan::unbounded::<Outcome>();
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let (jobs_rx, res_tx) = (jobs_rx.clone(), res_tx.clone());
                    fiber::spawn(move || {
                        let mut handled = 0;
                        for w in jobs_rx.iter() {
                            let id = match w {
                                Work::Square(n) | Work::Slow(n) | Work::Explode(n) => n,
                            };
                            let r = std::panic::catch_unwind(|| fiber::with_timeout(ms(100), || run_job(w)));
                            let out = match r {
                                Ok(Ok(Ok(v))) => Outcome::Done(id, v),
                                Ok(Ok(Err(fiber::Cancelled))) => panic!("cancelled without a timeout"),
                                Ok(Err(fiber::TimedOut)) => Outcome::TimedOut(id),
                                Err(p) => Outcome::Panicked(
                                    id,
                                    p.downcast_ref::<String>().cloned().unwrap_or_else(|| "?".into()),
                                ),
                            };
                            res_tx.send(out).unwrap();
                            handled += 1;
                        }
                        handled
                    })
                })
                .collect();
            drop((jobs_rx, res_tx));

            let mut expected = Vec::new();
            let producer = fiber::spawn(move || {
                for n in 0..60u64 {
                    let w = match n % 20 {
                        7 => Work::Slow(n),
                        13 => Work::Explode(n),
                        _ => Work::Square(n),
                    };
                    jobs_tx.send(w).unwrap();
                }
                // Dropping jobs_tx here is the graceful shutdown.
            });
            for n in 0..60u64 {
                expected.push(match n % 20 {
                    7 => Outcome::TimedOut(n),
                    13 => Outcome::Panicked(n, format!("job {n} exploded")),
                    _ => Outcome::Done(n, n * n),
                });
            }
            let mut got: Vec<Outcome> = res_rx.iter().collect();
            producer.join().unwrap();
            let handled: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
            assert_eq!(handled, 60);
            let key = |o: &Outcome| match o {
                Outcome::Done(n, _) | Outcome::TimedOut(n) | Outcome::Panicked(n, _) => *n,
            };
            got.sort_by_key(key);
            assert_eq!(got, expected);
            settle_to(baseline);
        });
    });
}

// ---------------------------------------------------------------------------
// 3. A pipeline of stages over bounded channels, failed half-way by one
//    stage's Err: every stage ends, no value is lost or duplicated (each
//    item is either consumed by the sink or dropped exactly once), and the
//    error try_scope returns is the stage's.
// ---------------------------------------------------------------------------

static CREATED: AtomicUsize = AtomicUsize::new(0);
static DROPPED: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
struct Item(u64);

impl Item {
    fn new(n: u64) -> Item {
        CREATED.fetch_add(1, Ordering::SeqCst);
        Item(n)
    }
}

impl Drop for Item {
    fn drop(&mut self) {
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Debug, PartialEq)]
enum PipeError {
    Corrupt(u64),
}

#[test]
fn pipeline_failed_mid_way_by_one_stage_ends_every_stage_and_loses_nothing() {
    within(60, || {
        rt().block_on(|| {
            let baseline = fiber::stats().runtime.fibers_alive;
            let seen = Mutex::new(Vec::new());
            let (src_tx, src_rx) = chan::bounded::<Item>(4);
            let (mid_tx, mid_rx) = chan::bounded::<Item>(4);
            let (out_tx, out_rx) = chan::bounded::<Item>(0);
            let result: Result<(), PipeError> = fiber::try_scope(|s| {
                // source: would produce a million items; blocks on backpressure.
                s.spawn(move || {
                    for n in 0..1_000_000 {
                        if src_tx.send(Item::new(n)).is_err() {
                            // Cancelled (the value came back in the error and was dropped).
                            assert!(fiber::is_cancelled());
                            break;
                        }
                    }
                    Ok(())
                });
                // validate x3: item 5000 is corrupt.
                for _ in 0..3 {
                    let (src_rx, mid_tx) = (src_rx.clone(), mid_tx.clone());
                    s.spawn(move || {
                        for item in src_rx.iter() {
                            if item.0 == 5000 {
                                return Err(PipeError::Corrupt(item.0));
                            }
                            if mid_tx.send(item).is_err() {
                                break;
                            }
                        }
                        Ok(())
                    });
                }
                drop((src_rx, mid_tx));
                // transform: double, then forward to the sink.
                s.spawn(move || {
                    for item in mid_rx.iter() {
                        let doubled = Item::new(item.0 * 2);
                        drop(item);
                        if let Err(e) = out_tx.send(doubled) {
                            drop(e.into_inner());
                            break;
                        }
                    }
                    Ok(())
                });
                // sink: remember what came out.
                let seen = &seen;
                s.spawn(move || {
                    for item in out_rx.iter() {
                        seen.lock().unwrap().push(item.0 / 2);
                    }
                    Ok(())
                });
                Ok(())
            });
            assert_eq!(result, Err(PipeError::Corrupt(5000)));
            let seen = seen.into_inner().unwrap();
            // No duplicates, nothing past a sane window, item 5000 never got through.
            let uniq: HashSet<u64> = seen.iter().copied().collect();
            assert_eq!(uniq.len(), seen.len(), "an item came out twice");
            assert!(!uniq.contains(&5000));
            assert!(
                seen.len() >= 4000,
                "only {} items came through before the failure",
                seen.len()
            );
            assert!(
                seen.len() < 5100,
                "{} items came through: the source was not stopped",
                seen.len()
            );
            // Every item made was dropped exactly once (in flight ones by the channels).
            settle_to(baseline);
            assert_eq!(CREATED.load(Ordering::SeqCst), DROPPED.load(Ordering::SeqCst));
        });
    });
}

// ---------------------------------------------------------------------------
// 4. Go-style fan-in: select! over three producers, a ticker and an overall
//    timeout; a producer that is done is removed from the select (its
//    receiver replaced by never(), the crossbeam idiom), and the loop ends
//    when every producer is done. Then the same with Select::remove.
// ---------------------------------------------------------------------------

fn producer(id: u64, n: u64, every: Duration) -> Receiver<(u64, u64)> {
    let (tx, rx) = chan::bounded(0);
    fiber::spawn(move || {
        for i in 0..n {
            fiber::sleep(every).unwrap();
            tx.send((id, i)).unwrap();
        }
    });
    rx
}

#[test]
fn fan_in_with_select_ticker_and_timeout_ends_when_all_producers_are_done() {
    within(60, || {
        rt().block_on(|| {
            let baseline = fiber::stats().runtime.fibers_alive;
            let mut a = producer(1, 20, ms(2));
            let mut b = producer(2, 10, ms(5));
            let mut c = producer(3, 3, ms(20));
            let ticker = chan::tick(ms(10));
            let timeout = chan::after(Duration::from_secs(10));
            let (mut open, mut ticks) = (3, 0);
            let mut got: HashMap<u64, Vec<u64>> = HashMap::new();
            while open > 0 {
                select! {
                    recv(a) -> m => match m {
                        Ok((id, i)) => got.entry(id).or_default().push(i),
                        Err(_) => { a = chan::never(); open -= 1; }
                    },
                    recv(b) -> m => match m {
                        Ok((id, i)) => got.entry(id).or_default().push(i),
                        Err(_) => { b = chan::never(); open -= 1; }
                    },
                    recv(c) -> m => match m {
                        Ok((id, i)) => got.entry(id).or_default().push(i),
                        Err(_) => { c = chan::never(); open -= 1; }
                    },
                    recv(ticker) -> t => { t.unwrap(); ticks += 1; },
                    recv(timeout) -> _ => panic!("fan-in timed out with {got:?}"),
                }
            }
            assert_eq!(got[&1], (0..20).collect::<Vec<_>>());
            assert_eq!(got[&2], (0..10).collect::<Vec<_>>());
            assert_eq!(got[&3], (0..3).collect::<Vec<_>>());
            assert!(ticks >= 3, "the 10 ms ticker fired {ticks} times in a >= 60 ms run");

            // The same with the Select builder and remove().
            let rxs = [producer(1, 20, ms(1)), producer(2, 5, ms(3)), producer(3, 1, ms(7))];
            let ticker = chan::tick(ms(5));
            let mut sel = chan::Select::new();
            for r in &rxs {
                sel.recv(r);
            }
            let tick_ix = sel.recv(&ticker);
            let mut counts = [0u64; 3];
            let mut open = 3;
            while open > 0 {
                let op = sel.select_timeout(Duration::from_secs(10)).expect("fan-in timed out");
                let i = op.index();
                if i == tick_ix {
                    op.recv(&ticker).unwrap();
                    continue;
                }
                match op.recv(&rxs[i]) {
                    Ok((id, n)) => {
                        assert_eq!(id, i as u64 + 1);
                        assert_eq!(n, counts[i]);
                        counts[i] += 1;
                    }
                    Err(_) => {
                        sel.remove(i);
                        open -= 1;
                    }
                }
            }
            assert_eq!(counts, [20, 5, 1]);
            settle_to(baseline);
        });
    });
}

// ---------------------------------------------------------------------------
// 5. Structured concurrency a la Kotlin.
// ---------------------------------------------------------------------------

#[test]
fn supervisor_scope_one_child_fails_the_others_go_on_and_results_are_collected() {
    within(60, || {
        rt().block_on(|| {
            let finished = AtomicUsize::new(0);
            let results: Vec<Result<u64, String>> = fiber::supervisor_scope(|s| {
                let handles: Vec<_> = (0..5u64)
                    .map(|i| {
                        let finished = &finished;
                        s.spawn(move || {
                            fiber::sleep(ms(5 * i)).unwrap();
                            if i == 1 {
                                panic!("child {i} failed");
                            }
                            // Siblings of the failed child are not cancelled.
                            fiber::sleep(ms(20)).expect("a sibling of a failed child was cancelled");
                            assert!(Job::current().is_active());
                            finished.fetch_add(1, Ordering::SeqCst);
                            i * 10
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().map_err(|e| {
                            assert!(e.is_panic(), "{e}");
                            *e.into_panic().downcast::<String>().unwrap()
                        })
                    })
                    .collect()
            });
            assert_eq!(
                results,
                vec![Ok(0), Err("child 1 failed".to_string()), Ok(20), Ok(30), Ok(40)]
            );
            assert_eq!(finished.load(Ordering::SeqCst), 4);
        });
    });
}

use fiber::Job;

#[derive(Debug, PartialEq)]
enum Seen {
    Sleep(bool),
    Recv(bool),
    Join(bool),
    LockThenCheck(bool),
    CondvarWait(bool),
    Grandchild(bool),
}

#[test]
fn cancelling_a_parent_reaches_children_parked_in_sleep_recv_join_lock_condvar_and_grandchildren() {
    within(60, || {
        rt().block_on(|| {
            let baseline = fiber::stats().runtime.fibers_alive;
            let (_keep_tx, rx) = chan::bounded::<u64>(0); // nobody ever sends
            let lock = Arc::new(Mutex::new(0u64));
            let pair = Arc::new((Mutex::new(false), Condvar::new()));
            let (seen_tx, seen_rx) = chan::unbounded::<Seen>();
            let (parked_tx, parked_rx) = chan::unbounded::<()>();

            let guard = lock.lock().unwrap(); // held by the root across the cancel
            let parent = {
                let (lock, pair) = (lock.clone(), pair.clone());
                fiber::spawn(move || {
                    fiber::scope(|s| {
                        let seen = &seen_tx;
                        let parked = &parked_tx;
                        s.spawn(move || {
                            parked.send(()).unwrap();
                            let r = fiber::sleep(Duration::from_secs(60));
                            seen.send(Seen::Sleep(r.is_err() && fiber::is_cancelled()))
                                .unwrap_or(());
                        });
                        s.spawn(move || {
                            parked.send(()).unwrap();
                            let r = rx.recv();
                            seen.send(Seen::Recv(r.is_err() && fiber::is_cancelled())).unwrap_or(());
                        });
                        let long = s.spawn(|| fiber::sleep(Duration::from_secs(60)).map(|_| 5));
                        s.spawn(move || {
                            parked.send(()).unwrap();
                            let r = long.join();
                            seen.send(Seen::Join(r.is_err())).unwrap_or(());
                        });
                        s.spawn(move || {
                            parked.send(()).unwrap();
                            let mut g = lock.lock().unwrap(); // not a cancellation point, as in std
                            *g += 1;
                            seen.send(Seen::LockThenCheck(fiber::check_cancelled().is_err()))
                                .unwrap_or(());
                        });
                        s.spawn(move || {
                            parked.send(()).unwrap();
                            let (m, cv) = &*pair;
                            let r = cv.wait_while(m.lock().unwrap(), |ready| !*ready);
                            // Cancelled: the wait returned early, the condition still false.
                            let still_false = r.map(|g| !*g).unwrap_or(false);
                            seen.send(Seen::CondvarWait(still_false && fiber::is_cancelled()))
                                .unwrap_or(());
                        });
                        s.spawn(move || {
                            fiber::scope(|inner| {
                                inner.spawn(move || {
                                    parked.send(()).unwrap();
                                    let r = fiber::sleep(Duration::from_secs(60));
                                    let job = Job::current();
                                    seen.send(Seen::Grandchild(r.is_err() && job.is_cancelled()))
                                        .unwrap_or(());
                                });
                            });
                        });
                    });
                    "parent finished"
                })
            };
            for _ in 0..6 {
                parked_rx.recv().unwrap();
            }
            fiber::sleep(ms(50)).unwrap(); // let them reach their parks (the outcome holds either way)
            parent.cancel();
            fiber::sleep(ms(20)).unwrap();
            drop(guard);
            let err = parent.join().unwrap_err();
            assert!(err.is_cancelled(), "{err}");

            let mut seen: Vec<Seen> = seen_rx.iter().collect();
            seen.sort_by_key(|s| format!("{s:?}"));
            assert_eq!(
                seen,
                vec![
                    Seen::CondvarWait(true),
                    Seen::Grandchild(true),
                    Seen::Join(true),
                    Seen::LockThenCheck(true),
                    Seen::Recv(true),
                    Seen::Sleep(true),
                ]
            );
            assert_eq!(*lock.lock().unwrap(), 1);
            settle_to(baseline);
        });
    });
}

#[test]
fn a_job_handed_out_as_a_cancellation_token_stops_a_worker_and_cancel_and_join_waits() {
    within(60, || {
        rt().block_on(|| {
            let (job_tx, job_rx) = chan::bounded::<Job>(1);
            let (progress_tx, progress_rx) = chan::unbounded::<u64>();
            let worker = fiber::spawn(move || {
                job_tx.send(Job::current()).unwrap();
                let mut n = 0;
                // A polling worker: no waits, only check_cancelled / yield_now.
                while fiber::check_cancelled().is_ok() {
                    n += 1;
                    if n % 100 == 0 {
                        let _ = progress_tx.send(n);
                    }
                    if fiber::yield_now().is_err() {
                        break;
                    }
                }
                n
            });
            let token = job_rx.recv().unwrap();
            assert!(token.is_active());
            // Wait for some progress, then cancel through the token and wait.
            assert!(progress_rx.recv().unwrap() >= 100);
            let state = token.cancel_and_join().unwrap();
            assert_eq!(state, fiber::JobState::Cancelled);
            assert!(token.is_completed() && token.is_cancelled());
            assert_eq!(token.cancel_reason(), Some(fiber::CancelReason::Cancelled));
            assert!(worker.is_finished());
            let err = worker.join().unwrap_err();
            assert!(err.is_cancelled(), "{err}");
        });
    });
}

// ---------------------------------------------------------------------------
// 6. Threads and fibers together: a std::thread producer feeding fibers
//    through fiber::chan; a fiber serving a plain thread's requests through
//    a fiber::sync::Mutex + Condvar; fiber::blocking for file reads while
//    the only worker keeps running other fibers.
// ---------------------------------------------------------------------------

#[test]
fn a_std_thread_feeds_fibers_and_a_fiber_answers_a_thread_through_mutex_and_condvar() {
    within(60, || {
        let rt = rt();
        // A std::thread producer, started before the runtime is even used.
        let (tx, rx) = chan::bounded::<u64>(4);
        let producer = std::thread::spawn(move || {
            for i in 1..=10_000u64 {
                tx.send(i).unwrap();
            }
        });

        // Request/response mailbox between a thread (client) and a fiber (server).
        #[derive(Default)]
        struct Mailbox {
            request: Option<u64>,
            response: Option<u64>,
            closed: bool,
        }
        let mailbox = Arc::new((Mutex::new(Mailbox::default()), Condvar::new()));
        let mb = mailbox.clone();
        let client = std::thread::spawn(move || {
            let (m, cv) = &*mb;
            let mut answers = Vec::new();
            for q in 1..=50u64 {
                let mut g = m.lock().unwrap();
                g.request = Some(q);
                cv.notify_all();
                let (mut g, to) = cv
                    .wait_timeout_while(g, Duration::from_secs(10), |g| g.response.is_none())
                    .unwrap();
                assert!(!to.timed_out(), "the fiber never answered request {q}");
                answers.push(g.response.take().unwrap());
            }
            m.lock().unwrap().closed = true;
            cv.notify_all();
            answers
        });

        let (sum, served) = rt.block_on(move || {
            let server = fiber::spawn(move || {
                let (m, cv) = &*mailbox;
                let mut served = 0;
                let mut g = m.lock().unwrap();
                loop {
                    g = cv.wait_while(g, |g| g.request.is_none() && !g.closed).unwrap();
                    if let Some(q) = g.request.take() {
                        g.response = Some(q * q);
                        served += 1;
                        cv.notify_all();
                    } else {
                        return served;
                    }
                }
            });
            let consumers: Vec<_> = (0..4)
                .map(|_| {
                    let rx = rx.clone();
                    fiber::spawn(move || rx.iter().sum::<u64>())
                })
                .collect();
            drop(rx);
            let sum: u64 = consumers.into_iter().map(|c| c.join().unwrap()).sum();
            (sum, server.join().unwrap())
        });
        producer.join().unwrap();
        assert_eq!(sum, 10_000 * 10_001 / 2);
        assert_eq!(served, 50);
        assert_eq!(client.join().unwrap(), (1..=50u64).map(|q| q * q).collect::<Vec<_>>());
    });
}

#[test]
fn blocking_file_reads_keep_the_only_worker_free() {
    within(60, || {
        let dir = std::env::temp_dir().join(format!("fiber-adv7-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..4 {
            std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n").repeat(1000)).unwrap();
        }
        let rt = fiber::Runtime::builder().workers(1).max_workers(1).build().unwrap();
        let d = dir.clone();
        let (lens, ticks) = rt.block_on(move || {
            let ticker = fiber::spawn(|| {
                // Runs while the file reads block their pool threads.
                let mut n = 0;
                let t0 = Instant::now();
                while t0.elapsed() < ms(150) {
                    fiber::sleep(ms(5)).unwrap();
                    n += 1;
                }
                n
            });
            let readers: Vec<_> = (0..4)
                .map(|i| {
                    let path = d.join(format!("f{i}.txt"));
                    fiber::spawn(move || {
                        fiber::blocking(move || {
                            // A slow disk: the read blocks its thread for a while.
                            std::thread::sleep(ms(100));
                            std::fs::read_to_string(path)
                        })
                        .unwrap()
                        .len()
                    })
                })
                .collect();
            let lens: Vec<usize> = readers.into_iter().map(|r| r.join().unwrap()).collect();
            (lens, ticker.join().unwrap())
        });
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(lens, vec![7000; 4]);
        assert!(ticks >= 10, "the worker was blocked by the file reads ({ticks} ticks)");
    });
}

// ---------------------------------------------------------------------------
// 7. An HTTP-like request/response server with keep-alive and socket
//    timeouts: a stalled client is timed out, a client that never reads a
//    big response is timed out on write, a client with a read timeout gives
//    up on a slow handler; shutdown cancels the server and every
//    connection fiber ends.
// ---------------------------------------------------------------------------

#[derive(Default)]
struct ServerLog {
    accepted: AtomicUsize,
    served: AtomicUsize,
    read_timeouts: AtomicUsize,
    write_timeouts: AtomicUsize,
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

fn handle_http(stream: TcpStream, log: &ServerLog) {
    stream.set_read_timeout(Some(ms(300))).unwrap();
    stream.set_write_timeout(Some(ms(300))).unwrap();
    let mut out = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        // Request line and headers.
        let mut request_line = String::new();
        let mut content_length = 0usize;
        let mut line = String::new();
        let head = (|| -> std::io::Result<bool> {
            if reader.read_line(&mut request_line)? == 0 {
                return Ok(false);
            }
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Ok(false);
                }
                if line == "\r\n" {
                    return Ok(true);
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    content_length = v.trim().parse().unwrap();
                }
            }
        })();
        let mut body = vec![0; content_length];
        let read = head.and_then(|more| {
            if more {
                reader.read_exact(&mut body).map(|_| true)
            } else {
                Ok(false)
            }
        });
        match read {
            Ok(false) => return, // client closed the connection
            Ok(true) => {}
            Err(e) if is_timeout(&e) => {
                log.read_timeouts.fetch_add(1, Ordering::SeqCst);
                let _ = out.write_all(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n");
                return;
            }
            Err(_) => return,
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let reply: Vec<u8> = match path.as_str() {
            "/slow" => {
                if fiber::sleep(Duration::from_secs(2)).is_err() {
                    return;
                }
                b"slow".to_vec()
            }
            "/big" => vec![b'z'; 16 << 20],
            _ => format!("{path} {}", String::from_utf8_lossy(&body).to_uppercase()).into_bytes(),
        };
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", reply.len());
        if let Err(e) = out.write_all(head.as_bytes()).and_then(|_| out.write_all(&reply)) {
            if is_timeout(&e) {
                log.write_timeouts.fetch_add(1, Ordering::SeqCst);
            }
            return;
        }
        log.served.fetch_add(1, Ordering::SeqCst);
    }
}

/// Read one response: (status, body).
fn read_response(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<u8>)> {
    let mut status = String::new();
    if r.read_line(&mut status)? == 0 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    let code = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut len = 0;
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.strip_prefix("Content-Length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body)?;
    Ok((code, body))
}

#[test]
fn http_keep_alive_server_with_read_and_write_timeouts() {
    within(60, || {
        rt().block_on(|| {
            let baseline = fiber::stats().runtime.fibers_alive;
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let log = Arc::new(ServerLog::default());
            let server = {
                let log = log.clone();
                fiber::spawn(move || {
                    fiber::scope(|s| {
                        for conn in listener.incoming() {
                            let Ok(conn) = conn else { break };
                            log.accepted.fetch_add(1, Ordering::SeqCst);
                            let log = &log;
                            s.spawn(move || handle_http(conn, log));
                        }
                    })
                })
            };

            // (a) Keep-alive: five requests on one connection.
            let conn = TcpStream::connect(addr).unwrap();
            let mut w = conn.try_clone().unwrap();
            let mut r = BufReader::new(conn);
            for i in 0..5 {
                let body = format!("hello {i}");
                write!(w, "POST /echo HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
                let (code, got) = read_response(&mut r).unwrap();
                assert_eq!(code, 200);
                assert_eq!(got, format!("/echo HELLO {i}").into_bytes());
            }
            assert_eq!(log.accepted.load(Ordering::SeqCst), 1, "keep-alive used one connection");

            // (b) A client that stalls mid-request gets a 408 and is closed.
            let stalled = TcpStream::connect(addr).unwrap();
            (&stalled)
                .write_all(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
                .unwrap();
            let t0 = Instant::now();
            let mut sr = BufReader::new(stalled);
            let (code, _) = read_response(&mut sr).unwrap();
            assert_eq!(code, 408);
            let mut rest = Vec::new();
            assert_eq!(sr.read_to_end(&mut rest).unwrap(), 0, "closed after the 408");
            let waited = t0.elapsed();
            assert!(
                waited >= ms(250) && waited < ms(3000),
                "stalled client timed out after {waited:?}"
            );

            // (c) A client with its own read timeout gives up on /slow.
            let impatient = TcpStream::connect(addr).unwrap();
            impatient.set_read_timeout(Some(ms(200))).unwrap();
            (&impatient).write_all(b"GET /slow HTTP/1.1\r\n\r\n").unwrap();
            let t0 = Instant::now();
            let mut buf = [0u8; 64];
            let err = (&impatient).read(&mut buf).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err:?}");
            assert!(t0.elapsed() >= ms(190) && t0.elapsed() < ms(2000), "{:?}", t0.elapsed());
            drop(impatient);

            // (d) A client that never reads a 16 MiB response: the server's
            //     write times out and it drops the connection.
            let hoarder = TcpStream::connect(addr).unwrap();
            (&hoarder).write_all(b"GET /big HTTP/1.1\r\n\r\n").unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while log.write_timeouts.load(Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the server's write never timed out");
                fiber::sleep(ms(10)).unwrap();
            }

            // The keep-alive connection from (a) is still usable... until it idles out.
            write!(w, "GET /again HTTP/1.1\r\n\r\n").unwrap_or(());
            let again = read_response(&mut r);
            // It idled more than 300 ms during (b)-(d): the server closed it with a 408.
            assert!(matches!(again, Ok((408, _))), "{again:?}");

            // Shutdown: cancel the server; every connection fiber ends.
            server.cancel();
            assert!(server.join().unwrap_err().is_cancelled());
            drop((hoarder, w, r));
            assert_eq!(log.served.load(Ordering::SeqCst), 5);
            assert!(log.read_timeouts.load(Ordering::SeqCst) >= 2);
            settle_to(baseline);
        });
    });
}

// ---------------------------------------------------------------------------
// 8. Timers and sync in small utilities: Go's bursty rate limiter (tick +
//    a bounded token bucket), a debouncer (recv_timeout), a fixed-rate loop
//    with sleep_until that does not drift, a cache (RwLock + OnceLock)
//    whose loader runs once per key, and a semaphore-bounded crawler
//    waited for with a WaitGroup.
// ---------------------------------------------------------------------------

#[test]
fn go_style_bursty_rate_limiter_with_tick() {
    within(60, || {
        rt().block_on(|| {
            // gobyexample.com/rate-limiting: a bucket of 3 tokens refilled by a ticker.
            let (bucket_tx, bucket) = chan::bounded::<Instant>(3);
            for _ in 0..3 {
                bucket_tx.send(Instant::now()).unwrap();
            }
            let refill = fiber::spawn(move || {
                let ticker = chan::tick(ms(40));
                for t in ticker.iter() {
                    if bucket_tx.send(t).is_err() {
                        break;
                    }
                }
            });
            let t0 = Instant::now();
            let mut served_at = Vec::new();
            for _request in 0..7 {
                bucket.recv().unwrap();
                served_at.push(t0.elapsed());
            }
            // The first 3 go at once, the next 4 one per tick.
            assert!(served_at[2] < ms(30), "{served_at:?}");
            assert!(served_at[3] >= ms(35), "{served_at:?}");
            assert!(served_at[6] >= ms(150), "4 refills of 40 ms: {served_at:?}");
            assert!(served_at[6] < ms(1500), "{served_at:?}");
            refill.cancel();
            drop(bucket);
            assert!(refill.join().unwrap_err().is_cancelled());
        });
    });
}

#[test]
fn debouncer_emits_the_last_event_of_each_burst() {
    within(60, || {
        rt().block_on(|| {
            let (ev_tx, ev_rx) = chan::unbounded::<u32>();
            let (out_tx, out_rx) = chan::unbounded::<u32>();
            let debouncer = fiber::spawn(move || {
                let quiet = ms(40);
                let mut pending: Option<u32> = None;
                loop {
                    match pending {
                        None => match ev_rx.recv() {
                            Ok(v) => pending = Some(v),
                            Err(_) => return,
                        },
                        Some(last) => match ev_rx.recv_timeout(quiet) {
                            Ok(v) => pending = Some(v),
                            Err(chan::RecvTimeoutError::Timeout) => {
                                out_tx.send(last).unwrap();
                                pending = None;
                            }
                            Err(chan::RecvTimeoutError::Disconnected) => {
                                out_tx.send(last).unwrap();
                                return;
                            }
                        },
                    }
                }
            });
            // Three bursts of keystrokes, 150 ms apart; events 2 ms apart.
            for burst in 0..3u32 {
                for k in 0..10 {
                    ev_tx.send(burst * 100 + k).unwrap();
                    fiber::sleep(ms(2)).unwrap();
                }
                fiber::sleep(ms(150)).unwrap();
            }
            ev_tx.send(999).unwrap();
            drop(ev_tx);
            debouncer.join().unwrap();
            assert_eq!(out_rx.iter().collect::<Vec<_>>(), vec![9, 109, 209, 999]);
        });
    });
}

#[test]
fn a_fixed_rate_loop_with_sleep_until_does_not_drift() {
    within(60, || {
        rt().block_on(|| {
            let period = ms(10);
            let start = Instant::now();
            let mut next = start;
            let mut late = Duration::ZERO;
            for _ in 0..30 {
                next += period;
                fiber::sleep_until(next).unwrap();
                let now = Instant::now();
                assert!(now >= next, "woke early");
                late = late.max(now - next);
                // Some work that takes a variable time.
                std::hint::black_box((0..1000).sum::<u64>());
            }
            let total = start.elapsed();
            assert!(total >= ms(300), "{total:?}");
            // Delays do not accumulate: the end is one late wake-up past 300 ms.
            assert!(total < ms(300) + late + ms(50), "{total:?}, worst wake-up {late:?}");
        });
    });
}

#[test]
fn a_cache_with_rwlock_and_oncelock_loads_each_key_once() {
    within(60, || {
        rt().block_on(|| {
            struct Cache {
                map: RwLock<HashMap<String, Arc<OnceLock<String>>>>,
                loads: AtomicUsize,
            }
            impl Cache {
                fn get(&self, key: &str) -> String {
                    if let Some(cell) = self.map.read().unwrap().get(key) {
                        if let Some(v) = cell.get() {
                            return v.clone();
                        }
                    }
                    let cell = self.map.write().unwrap().entry(key.to_string()).or_default().clone();
                    // Concurrent callers for the same key wait for the one loader
                    // (the write lock is released: other keys load meanwhile).
                    cell.get_or_init(|| {
                        self.loads.fetch_add(1, Ordering::SeqCst);
                        fiber::sleep(ms(20)).unwrap(); // a slow backend
                        format!("value of {key}")
                    })
                    .clone()
                }
            }
            let cache = Cache {
                map: RwLock::new(HashMap::new()),
                loads: AtomicUsize::new(0),
            };
            let t0 = Instant::now();
            fiber::scope(|s| {
                for i in 0..100 {
                    let cache = &cache;
                    s.spawn(move || {
                        let key = format!("k{}", i % 5);
                        assert_eq!(cache.get(&key), format!("value of {key}"));
                    });
                }
            });
            assert_eq!(cache.loads.load(Ordering::SeqCst), 5, "each key loaded once");
            // The 5 loads ran concurrently, not one after the other.
            assert!(t0.elapsed() < ms(20 * 5), "{:?}", t0.elapsed());
            // Later reads hit the cache.
            assert_eq!(cache.get("k3"), "value of k3");
            assert_eq!(cache.loads.load(Ordering::SeqCst), 5);
        });
    });
}

#[test]
fn a_semaphore_bounded_crawler_waited_for_with_a_wait_group() {
    within(60, || {
        rt().block_on(|| {
            // A fake web: page n links to 2n+1 and 2n+2 below 200, and back to n/2.
            fn links(page: u64) -> Vec<u64> {
                [2 * page + 1, 2 * page + 2, page / 2]
                    .into_iter()
                    .filter(|&p| p < 200)
                    .collect()
            }
            struct Crawler {
                seen: Mutex<HashSet<u64>>,
                limit: Semaphore,
                in_flight: AtomicUsize,
                max_in_flight: AtomicUsize,
                fetches: AtomicUsize,
            }
            fn crawl(c: Arc<Crawler>, page: u64, wg: WaitGroup) {
                if !c.seen.lock().unwrap().insert(page) {
                    return;
                }
                let found = {
                    let _permit = c.limit.acquire().unwrap();
                    let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    c.max_in_flight.fetch_max(now, Ordering::SeqCst);
                    fiber::sleep(ms(1)).unwrap(); // the "HTTP request"
                    c.fetches.fetch_add(1, Ordering::SeqCst);
                    c.in_flight.fetch_sub(1, Ordering::SeqCst);
                    links(page)
                };
                for next in found {
                    let (c, wg) = (c.clone(), wg.clone());
                    fiber::spawn(move || crawl(c, next, wg));
                }
                drop(wg);
            }
            let c = Arc::new(Crawler {
                seen: Mutex::new(HashSet::new()),
                limit: Semaphore::new(3),
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
                fetches: AtomicUsize::new(0),
            });
            let wg = WaitGroup::new();
            {
                let (c, wg) = (c.clone(), wg.clone());
                fiber::spawn(move || crawl(c, 0, wg));
            }
            wg.wait();
            assert_eq!(c.fetches.load(Ordering::SeqCst), 200);
            assert_eq!(c.seen.lock().unwrap().len(), 200);
            let max = c.max_in_flight.load(Ordering::SeqCst);
            assert!(max <= 3, "the semaphore let {max} fetches run at once");
            assert!(max >= 2, "the crawl never ran fetches concurrently");
            assert_eq!(c.limit.available_permits(), 3);
        });
    });
}

// ---------------------------------------------------------------------------
// 9. Odds and ends a first-day user runs into.
// ---------------------------------------------------------------------------

/// Kotlin's supervisorScope: a failed child that nobody joins does not fail
/// the scope (its exception goes to the handler); fiber says the failure
/// "stays with the child for whoever joins it".
#[test]
fn supervisor_scope_with_an_unjoined_failed_child_returns_normally() {
    within(60, || {
        rt().block_on(|| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fiber::supervisor_scope(|s| {
                    s.spawn(|| panic!("fire and forget child failed"));
                    let ok = s.spawn(|| {
                        fiber::sleep(ms(20)).unwrap();
                        7
                    });
                    ok.join().unwrap()
                })
            }));
            match r {
                Ok(v) => assert_eq!(v, 7),
                Err(p) => panic!(
                    "supervisor_scope re-raised an unjoined child's panic: {:?}",
                    p.downcast_ref::<String>()
                        .map(|s| s.as_str())
                        .or(p.downcast_ref::<&str>().copied())
                ),
            }
        });
    });
}

/// A tokio user: a GUI / main thread submits work through a Handle and
/// waits on the JoinHandle from that plain thread; another thread uses
/// Handle::block_on while the main block_on runs.
#[test]
fn plain_threads_submit_work_through_a_handle_and_join_it() {
    within(60, || {
        let rt = rt();
        let handle = rt.handle();
        let (stop_tx, stop_rx) = chan::bounded::<()>(0);
        std::thread::scope(|ts| {
            let h1 = handle.clone();
            let submitter = ts.spawn(move || {
                let jobs: Vec<_> = (0..50u64)
                    .map(|i| {
                        h1.spawn(move || {
                            fiber::sleep(ms(1)).unwrap();
                            i * 2
                        })
                    })
                    .collect();
                jobs.into_iter().map(|j| j.join().unwrap()).sum::<u64>()
            });
            let h2 = handle.clone();
            let blocker = ts.spawn(move || {
                h2.block_on(|| {
                    fiber::scope(|s| {
                        (0..10u64)
                            .map(|i| s.spawn(move || i))
                            .map(|h| h.join().unwrap())
                            .sum::<u64>()
                    })
                })
            });
            let main = ts.spawn(|| {
                rt.block_on(|| {
                    // The "main" fiber waits for a stop signal from a plain thread.
                    stop_rx.recv().unwrap_err();
                    "main done"
                })
            });
            assert_eq!(submitter.join().unwrap(), 2 * (0..50).sum::<u64>());
            assert_eq!(blocker.join().unwrap(), 45);
            drop(stop_tx);
            assert_eq!(main.join().unwrap(), "main done");
        });
    });
}

/// Go: main returning ends the program whatever goroutines still wait.
/// fiber::run returns once its root returns; fibers parked in accept, read,
/// recv and sleep are cancelled at shutdown and must not hold it for the
/// grace time.
#[test]
fn run_returns_promptly_with_detached_fibers_parked_on_sockets_channels_and_timers() {
    within(60, || {
        let t0 = Instant::now();
        let rt = fiber::Runtime::builder().workers(2).build().unwrap(); // default 5 s grace
        let v = rt.block_on(|| {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            fiber::spawn(move || {
                for c in listener.incoming() {
                    let mut c = c.unwrap();
                    fiber::spawn(move || {
                        let mut buf = [0; 16];
                        while c.read(&mut buf).map(|n| n > 0).unwrap_or(false) {}
                    });
                }
            });
            let client = TcpStream::connect(addr).unwrap();
            let (tx, rx) = chan::bounded::<u8>(0);
            fiber::spawn(move || rx.recv());
            fiber::spawn(|| fiber::sleep(Duration::from_secs(3600)));
            fiber::spawn(move || {
                let _keep = (tx, client);
                fiber::sleep(Duration::MAX)
            });
            fiber::sleep(ms(50)).unwrap();
            42
        });
        drop(rt);
        assert_eq!(v, 42);
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "shutdown took {:?}",
            t0.elapsed()
        );
    });
}

/// A fan-in loop that tracks "done" per producer, written the crossbeam
/// way, then timed out by with_timeout: does with_timeout come back?
#[test]
fn a_crossbeam_style_fan_in_loop_inside_with_timeout_comes_back() {
    within(60, || {
        rt().block_on(|| {
            let (a_tx, a) = chan::bounded::<u32>(0);
            let (_b_tx, b) = chan::bounded::<u32>(0); // a producer that stalls
            fiber::spawn(move || {
                for i in 0..3 {
                    a_tx.send(i).unwrap();
                }
            });
            let t0 = Instant::now();
            let spins = AtomicUsize::new(0);
            let r = fiber::with_timeout(ms(100), || {
                let (mut a, mut b) = (a, b);
                let (mut a_done, mut b_done) = (false, false);
                let mut got = Vec::new();
                let mut rounds = 0u64;
                while !(a_done && b_done) {
                    rounds += 1;
                    spins.store(rounds as usize, Ordering::SeqCst);
                    if rounds > 1_000_000 {
                        return Err(format!("spinning: {rounds} selects, got {got:?}"));
                    }
                    select! {
                        recv(a) -> m => match m {
                            Ok(v) => got.push(v),
                            Err(_) => { a_done = true; a = chan::never(); }
                        },
                        recv(b) -> m => match m {
                            Ok(v) => got.push(v),
                            Err(_) => { b_done = true; b = chan::never(); }
                        },
                    }
                }
                Ok(got)
            });
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
            assert_eq!(r, Err(fiber::TimedOut), "with_timeout did not report the timeout");
            // The cancelled select ran a live arm with a failure once, and the loop ended.
            assert!(
                spins.load(Ordering::SeqCst) < 100,
                "{} selects",
                spins.load(Ordering::SeqCst)
            );
        });
    });
}

/// A config that many readers poll while an admin fiber reloads it: the
/// writer must get in while readers keep coming (std's RwLock on Linux and
/// tokio's RwLock both prefer a waiting writer over new readers).
#[test]
fn a_config_reload_gets_the_write_lock_while_readers_keep_coming() {
    within(60, || {
        rt().block_on(|| {
            let config = Arc::new(RwLock::new(1u64));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let readers: Vec<_> = (0..8)
                .map(|i| {
                    let (config, stop) = (config.clone(), stop.clone());
                    fiber::spawn(move || {
                        let mut reads = 0u64;
                        fiber::sleep(ms(i)).unwrap(); // staggered, so read sections overlap
                        while !stop.load(Ordering::SeqCst) {
                            let v = config.read().unwrap();
                            fiber::sleep(ms(3)).unwrap(); // use the config for a while
                            assert!(*v >= 1);
                            drop(v);
                            reads += 1;
                        }
                        reads
                    })
                })
                .collect();
            fiber::sleep(ms(30)).unwrap();
            let t0 = Instant::now();
            let reload = fiber::with_timeout(Duration::from_secs(3), || {
                *config.write().unwrap() = 2;
            });
            let waited = t0.elapsed();
            stop.store(true, Ordering::SeqCst);
            let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
            assert!(reads > 0);
            assert!(
                reload.is_ok() && waited < Duration::from_secs(1),
                "the writer waited {waited:?}"
            );
            assert_eq!(*config.read().unwrap(), 2);
        });
    });
}

/// std's OnceLock: if the initializer panics, the cell stays empty and the
/// next caller (including one that was waiting) runs its own initializer.
#[test]
fn a_cache_loader_that_panics_lets_the_waiting_callers_retry() {
    within(60, || {
        rt().block_on(|| {
            let cell = OnceLock::new();
            let attempts = AtomicUsize::new(0);
            // supervisor_scope: in fiber::scope the loader's panic would cancel the waiters.
            let results: Vec<Result<String, String>> = fiber::supervisor_scope(|s| {
                let hs: Vec<_> = (0..5)
                    .map(|_| {
                        s.spawn(|| {
                            cell.get_or_init(|| {
                                let n = attempts.fetch_add(1, Ordering::SeqCst);
                                fiber::sleep(ms(20)).unwrap();
                                if n == 0 {
                                    panic!("backend down");
                                }
                                format!("loaded on attempt {n}")
                            })
                            .clone()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .map_err(|e| *e.into_panic().downcast::<&str>().unwrap())
                            .map_err(str::to_string)
                    })
                    .collect()
            });
            assert_eq!(attempts.load(Ordering::SeqCst), 2, "{results:?}");
            assert_eq!(results.iter().filter(|r| r.is_err()).count(), 1, "{results:?}");
            assert!(
                results.iter().flatten().all(|v| v == "loaded on attempt 1"),
                "{results:?}"
            );
        });
    });
}

/// Per-request context in a fiber-local (a request id for logging), named
/// fibers, and a failure report that names the fiber.
#[test]
fn named_fibers_and_a_fiber_local_request_id() {
    fiber::fiber_local! {
        static REQUEST_ID: std::cell::Cell<u64> = std::cell::Cell::new(0);
    }
    fn log_line(msg: &str) -> String {
        let name = fiber::current().name().unwrap_or("?").to_string();
        format!("[{name} req={}] {msg}", REQUEST_ID.with(|r| r.get()))
    }
    within(60, || {
        rt().block_on(|| {
            let handles: Vec<_> = (1..=20u64)
                .map(|id| {
                    fiber::Builder::new()
                        .name(format!("handler-{id}"))
                        .spawn(move || {
                            REQUEST_ID.with(|r| r.set(id));
                            fiber::sleep(ms(id % 4)).unwrap();
                            if id == 13 {
                                panic!("{}", log_line("unlucky request"));
                            }
                            log_line("done")
                        })
                        .unwrap()
                })
                .collect();
            for (i, h) in handles.into_iter().enumerate() {
                let id = i as u64 + 1;
                match h.join() {
                    Ok(line) => assert_eq!(line, format!("[handler-{id} req={id}] done")),
                    Err(e) => {
                        assert_eq!(id, 13);
                        assert_eq!(e.name(), Some("handler-13"));
                        assert!(e.to_string().contains("handler-13"), "{e}");
                        let msg = *e.into_panic().downcast::<String>().unwrap();
                        assert_eq!(msg, "[handler-13 req=13] unlucky request");
                    }
                }
            }
        });
    });
}

/// A phased simulation: workers compute a step, meet at a barrier, the
/// leader publishes the aggregate, repeat.
#[test]
fn a_barrier_phased_simulation() {
    within(60, || {
        rt().block_on(|| {
            const N: usize = 6;
            let barrier = fiber::sync::Barrier::new(N);
            let cells = Mutex::new(vec![0u64; N]);
            let totals = Mutex::new(Vec::new());
            fiber::scope(|s| {
                for i in 0..N {
                    let (barrier, cells, totals) = (&barrier, &cells, &totals);
                    s.spawn(move || {
                        for step in 1..=10u64 {
                            fiber::sleep(ms((i as u64 * 7 + step) % 3)).unwrap();
                            cells.lock().unwrap()[i] += step * (i as u64 + 1);
                            if barrier.wait().is_leader() {
                                let sum: u64 = cells.lock().unwrap().iter().sum();
                                totals.lock().unwrap().push(sum);
                            }
                            barrier.wait(); // nobody starts the next step before the leader read
                        }
                    });
                }
            });
            let totals = totals.into_inner().unwrap();
            let per_step: u64 = (1..=N as u64).sum();
            let expected: Vec<u64> = (1..=10u64).map(|k| per_step * k * (k + 1) / 2).collect();
            assert_eq!(totals, expected);
        });
    });
}

/// A UDP request/response client with a read timeout and retries against
/// a server that drops the first datagram of each request.
#[test]
fn udp_client_retries_on_read_timeout() {
    within(60, || {
        rt().block_on(|| {
            let server = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let addr = server.local_addr().unwrap();
            let srv = fiber::spawn(move || {
                let mut seen = HashSet::new();
                let mut buf = [0u8; 512];
                loop {
                    let (n, from) = match server.recv_from(&mut buf) {
                        Ok(x) => x,
                        Err(_) => return seen.len(),
                    };
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    if seen.insert(req.clone()) {
                        continue; // lost on the way
                    }
                    server.send_to(req.to_uppercase().as_bytes(), from).unwrap();
                }
            });
            let client = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            client.connect(addr).unwrap();
            client.set_read_timeout(Some(ms(50))).unwrap();
            let mut retries = 0;
            for q in ["alpha", "beta", "gamma"] {
                let mut buf = [0u8; 512];
                let answer = loop {
                    client.send(q.as_bytes()).unwrap();
                    match client.recv(&mut buf) {
                        Ok(n) => break String::from_utf8_lossy(&buf[..n]).to_string(),
                        Err(e) if is_timeout(&e) => retries += 1,
                        Err(e) => panic!("{e:?}"),
                    }
                };
                assert_eq!(answer, q.to_uppercase());
            }
            assert_eq!(retries, 3);
            srv.cancel();
            assert!(srv.join().unwrap_err().is_cancelled());
        });
    });
}

/// A blocking call that panics: the panic comes back in the fiber, as
/// tokio's spawn_blocking reports it through its JoinHandle.
#[test]
fn a_panic_in_a_blocking_call_reaches_the_fiber() {
    within(60, || {
        rt().block_on(|| {
            let h = fiber::spawn(|| {
                fiber::blocking(|| {
                    let _ = std::fs::read("/definitely/not/here").expect("config file missing");
                })
            });
            let e = h.join().unwrap_err();
            assert!(e.is_panic());
            let msg = *e.into_panic().downcast::<String>().unwrap();
            assert!(msg.starts_with("config file missing"), "{msg}");
            // The pool thread survived: the next blocking call works.
            assert_eq!(fiber::blocking(|| 1 + 1), 2);
        });
    });
}

/// Go's classic: `select { case v := <-ch: ...; case <-time.After(time.Minute): ... }`
/// in a hot loop, and recv_timeout with a long timeout that completes early:
/// the abandoned timers must not pile up in the runtime.
#[test]
fn abandoned_long_timers_in_a_hot_select_loop_do_not_pile_up() {
    within(60, || {
        rt().block_on(|| {
            let (tx, rx) = chan::bounded::<u64>(0);
            let producer = fiber::spawn(move || {
                for i in 0..20_000u64 {
                    tx.send(i).unwrap();
                }
            });
            let before = fiber::stats().runtime.timers_pending;
            let mut peak = 0;
            let mut sum = 0;
            for i in 0..20_000u64 {
                if i % 2 == 0 {
                    select! {
                        recv(rx) -> v => sum += v.unwrap(),
                        recv(chan::after(Duration::from_secs(60))) -> _ => panic!("timed out"),
                    }
                } else {
                    sum += rx.recv_timeout(Duration::from_secs(60)).unwrap();
                }
                if i % 1000 == 0 {
                    peak = peak.max(fiber::stats().runtime.timers_pending);
                }
            }
            producer.join().unwrap();
            assert_eq!(sum, 20_000 * 19_999 / 2);
            let after = fiber::stats().runtime.timers_pending;
            // Dead entries are purged in bulk (spec: when a wheel has doubled, floor
            // 1,024 entries per wheel): bounded, not one per iteration.
            assert!(
                peak < before + 5000 && after < before + 5000,
                "timers pending: before {before}, peak {peak}, after {after}"
            );
        });
    });
}
