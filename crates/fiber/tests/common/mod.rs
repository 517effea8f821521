//! Helpers shared by the adversarial and conformance test files: the test
//! runtime, a hang guard, a child process for scenarios that could abort,
//! and panic-message capture.
#![allow(dead_code)]

pub mod budget;
pub mod fuzz;
pub mod hold;
pub mod load;
pub mod shutdown;
pub mod sockets;

use std::panic::AssertUnwindSafe;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Run `f` on its own thread; fail (instead of hanging) if it takes more
/// than `secs` seconds, and re-raise its panic.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(AssertUnwindSafe(f));
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => match t.join().unwrap() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(_) => {
            eprintln!("{}", thread_report());
            panic!("hang: the body did not finish within {secs} s")
        }
    }
}

/// The threads of this process whose name starts with `prefix` (the
/// kernel cuts names to 15 bytes).
pub fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|n| n.trim_end().starts_with(prefix)))
        .count()
}

/// The process's threads as the kernel sees them, for a hang's failure
/// message: name, state, what it sleeps in (`wchan`) and the CPU time it
/// used during a 200 ms window (a spinning worker against one asleep in a
/// futex tells a lost timer from a lost wake-up).
pub fn thread_report() -> String {
    fn sample() -> Vec<(String, String, String, u64)> {
        let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        let mut threads = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap_or_default();
            let stat = read("stat");
            // Fields after the parenthesised name: state is the first,
            // utime and stime the 12th and 13th.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let cpu = fields.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
                + fields.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
            let tid = entry.file_name().to_string_lossy().into_owned();
            let name = format!("{tid} {}", read("comm").trim());
            threads.push((name, fields.first().unwrap_or(&"?").to_string(), read("wchan"), cpu));
        }
        threads
    }
    let before = sample();
    std::thread::sleep(Duration::from_millis(200));
    let after = sample();
    let mut out = String::from("threads (name, state, wchan, CPU ticks in 200 ms):\n");
    for (name, state, wchan, cpu) in &after {
        let was = before.iter().find(|b| &b.0 == name).map_or(*cpu, |b| b.3);
        out.push_str(&format!("  {name:<32} {state} {wchan:<24} {}\n", cpu - was));
    }
    out
}

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The runtime these tests use: 2 workers, a short shutdown grace.
pub fn rt() -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(2)
        .shutdown_timeout(ms(500))
        .build()
        .unwrap()
}

/// A runtime of exactly one worker (growth off), 300 ms shutdown grace.
pub fn rt1() -> fiber::Runtime {
    fixed(1)
}

/// A runtime of exactly two workers (growth off), 300 ms shutdown grace.
pub fn rt2() -> fiber::Runtime {
    fixed(2)
}

fn fixed(workers: usize) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .shutdown_timeout(ms(300))
        .build()
        .unwrap()
}

/// Run `f` as the root fiber of a fresh [`rt`], under a 30 s hang guard.
pub fn on_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    within(30, move || rt().block_on(f))
}

/// The environment variable that tells a child process which scenario
/// to run (each test binary is its own process, so one name serves all).
const CHILD_VAR: &str = "FIBER_ADVERSARIAL_CHILD";

/// In the parent: run the test `scenario` in a child process, require a
/// clean exit within `secs`. In the child: run `body`.
pub fn in_child(scenario: &str, secs: u64, body: impl FnOnce()) {
    if let Some((status, stderr)) = child_outcome(scenario, secs, &[], body) {
        assert!(status.success(), "child {scenario} failed ({status:?}):\n{stderr}");
    }
}

/// In the parent: run the test `scenario` in a child process (with the
/// extra environment `envs`) and return its exit status and stderr; a
/// child still running after `secs` is killed and the test fails (a hang).
/// In the child: run `body` and return `None`.
pub fn child_outcome(
    scenario: &str,
    secs: u64,
    envs: &[(&str, &str)],
    body: impl FnOnce(),
) -> Option<(std::process::ExitStatus, String)> {
    if std::env::var(CHILD_VAR).as_deref() == Ok(scenario) {
        body();
        return None;
    }
    // `--include-ignored`: the child runs the scenario even if it is marked
    // `#[ignore]` (it would otherwise run nothing and pass).
    let full_name = full_test_name(scenario);
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            full_name.as_str(),
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(CHILD_VAR, scenario)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in envs {
        child.env(name, value);
    }
    let mut child = child.spawn().unwrap();
    // Read stderr while the child runs: a child that writes more than the
    // pipe holds (many panics with backtraces) would otherwise block on
    // the full pipe and look like a hang.
    let mut pipe = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hang: child {scenario} did not exit within {secs} s");
        }
        std::thread::sleep(ms(20));
    };
    Some((status, err_reader.join().unwrap()))
}

/// The full name of the test `scenario` in this test binary, as `--exact`
/// needs it: the test named so, or the one whose module path ends in
/// `::scenario` (several test files are modules of one binary). The test
/// thread's own name breaks a tie. Fails loudly when no test matches: a
/// child told to run a name that is not a test would run nothing and pass.
pub fn full_test_name(scenario: &str) -> String {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--list", "--include-ignored"])
            .env_remove(CHILD_VAR)
            .stderr(Stdio::null())
            .output()
            .expect("list this binary's tests");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_suffix(": test"))
            .map(str::to_string)
            .collect()
    });
    let suffix = format!("::{scenario}");
    let matches: Vec<&String> = names
        .iter()
        .filter(|n| n.as_str() == scenario || n.ends_with(&suffix))
        .collect();
    if let [only] = matches.as_slice() {
        return only.to_string();
    }
    if let Some(own) = std::thread::current().name() {
        if matches.iter().any(|n| n.as_str() == own) {
            return own.to_string();
        }
    }
    panic!("in_child: scenario {scenario:?} names no single test of this binary (matches: {matches:?})");
}

/// This process's virtual size (`VmSize`), in bytes.
pub fn vm_size_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Cap this process's address space (`RLIMIT_AS`) at `bytes`
/// (`RLIM_INFINITY` or `u64::MAX` for none): thread and stack creation
/// then fail past it. Only in a child process (`in_child`).
pub fn limit_address_space(bytes: u64) {
    let lim = libc::rlimit {
        rlim_cur: bytes as libc::rlim_t,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain setrlimit call with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
}

/// The message of the panic `f` raises, if it panics.
pub fn panic_message(f: impl FnOnce()) -> Option<String> {
    let err = std::panic::catch_unwind(AssertUnwindSafe(f)).err()?;
    Some(
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

/// A runtime of `workers` workers with `grace` as its shutdown grace time.
pub fn rt_grace(workers: usize, grace: Duration) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .shutdown_timeout(grace)
        .build()
        .unwrap()
}

/// A runtime of exactly `workers` workers (growth off) with `grace` of
/// shutdown time.
pub fn rt_fixed_grace(workers: usize, grace: Duration) -> fiber::Runtime {
    fiber::Runtime::builder()
        .workers(workers)
        .max_workers(workers)
        .shutdown_timeout(grace)
        .build()
        .unwrap()
}

/// Sleep for ever, ignoring every cancellation (a fiber teardown must unwind).
pub fn stubborn_sleep() {
    loop {
        let _ = fiber::sleep(Duration::from_secs(3600));
    }
}

/// Wait (on a plain thread) until at least `n` fibers of `rt` are parked.
/// Counted from each fiber's own state word (`Runtime::dump`), not from
/// `Stats::fibers_parked`, which is live fibers minus queued and running
/// ones: a fiber a worker has just taken from a queue but not started yet
/// counts there as parked for a moment (on a loaded machine, long enough
/// for a test to go on before its fiber ever ran).
pub fn wait_parked(rt: &fiber::Runtime, n: usize) {
    let start = Instant::now();
    let parked = || {
        rt.dump()
            .fibers
            .iter()
            .filter(|f| f.state == fiber::core::state::FiberState::Parked)
            .count()
    };
    while parked() < n {
        assert!(start.elapsed() < Duration::from_secs(10), "fibers never parked");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// On one fixed worker: a poller loops on `op` until a second fiber sets
/// the flag. The second fiber is spawned only once the poller runs (its
/// signal makes the spawner runnable without parking the poller), so only
/// a yield in `op` lets the spawner, and then the setter, run.
pub fn poller_lets_others_run(op: fn()) {
    within(30, move || {
        let rt = rt_fixed_grace(1, ms(200));
        rt.block_on(move || {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            let (started_tx, started_rx) = fiber::chan::bounded(1);
            let poller = fiber::spawn(move || {
                started_tx.send(()).unwrap();
                let mut rounds = 0u64;
                while !s.load(std::sync::atomic::Ordering::SeqCst) {
                    op();
                    rounds += 1;
                }
                rounds
            });
            started_rx.recv().unwrap();
            let setter = fiber::spawn(move || stop.store(true, std::sync::atomic::Ordering::SeqCst));
            setter.join().unwrap();
            assert!(poller.join().unwrap() >= 1);
        });
    });
}

/// Write until a write fails; its error kind.
pub fn write_until_error(mut write: impl FnMut() -> std::io::Result<usize>) -> std::io::ErrorKind {
    loop {
        if let Err(e) = write() {
            return e.kind();
        }
    }
}

/// Cancel `handles` newest first, join them all, and count those that
/// ended cancelled.
pub fn cancel_from_the_back<T: Send + 'static>(handles: Vec<fiber::JoinHandle<T>>) -> usize {
    for h in handles.iter().rev() {
        h.cancel();
    }
    handles
        .into_iter()
        .map(|h| h.join())
        .filter(|r| r.as_ref().is_err_and(|e| e.is_cancelled()))
        .count()
}

/// Spin without any yield point until `flag` is set or `limit` passes;
/// `true` if the flag ended it.
pub fn spin_until(flag: &std::sync::atomic::AtomicBool, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if flag.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        std::hint::spin_loop();
    }
    false
}

/// In a fiber: wait (sleeping 1 ms at a time) until `cond` holds; fail
/// after `secs` seconds naming `what`.
pub fn wait_until(what: &str, secs: u64, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        fiber::sleep(ms(1)).unwrap();
    }
}

/// The last `Instant` this platform can represent (to the second; plus
/// 999,999,999 ns): any `+ Duration` on it but zero overflows.
pub fn last_instant() -> Instant {
    let now = Instant::now();
    let (mut lo, mut hi) = (0u64, u64::MAX);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if now.checked_add(Duration::from_secs(mid)).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let base = now + Duration::from_secs(lo);
    let mut nanos = 999_999_999u32;
    loop {
        if let Some(t) = base.checked_add(Duration::from_nanos(nanos as u64)) {
            return t;
        }
        nanos /= 2;
    }
}

/// Set a socket's `SO_RCVTIMEO` or `SO_SNDTIMEO` (`option`) behind fiber's
/// back, as a std handle or another library would.
pub fn set_sock_timeout(fd: std::os::fd::RawFd, option: libc::c_int, d: Duration) {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a valid timeval for an open socket the caller owns.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
}

/// In a fiber or on a thread: wait (up to 10 s) until the fiber `id` is
/// PARKED, as the runtime's dump shows it.
pub fn wait_fiber_parked(id: fiber::FiberId) {
    wait_until("the fiber to park", 10, || {
        fiber::dump()
            .fibers
            .iter()
            .any(|f| f.id == id && f.state == fiber::core::state::FiberState::Parked)
    });
}

/// CPU time (user + system) this process has used.
pub fn cpu_time() -> Duration {
    // SAFETY: `rusage` is plain data, valid when zeroed.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage with a valid out pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(u.ru_utime) + tv(u.ru_stime)
}
