//! Review 70: configurations the CI never runs (release builds, `FIBER_*`
//! variables). One library defect, shown only with `io_park` on
//! (`FIBER_IO_PARK=1`): a worker's wait in the I/O driver is made once, at
//! its first idle moment after the I/O layer is installed, and a failure
//! then is kept for good (`Slot::io_waiter` is a `OnceLock` of an
//! `Option`). One `epoll_create1` refused for want of a descriptor (or a
//! worker going idle between `set_io_poll` and the driver's `OnceLock`
//! being set, `fiber-net/src/driver.rs` `start`) turns `io_park` off for
//! that worker for the rest of the runtime's life, silently.

use crate::common::*;

use std::os::fd::{AsRawFd, OwnedFd};

/// Lower the soft descriptor limit to `n` and return the old limit.
fn set_nofile(n: libc::rlim_t) -> libc::rlimit {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a plain getrlimit call writing into a valid struct.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut old) }, 0);
    let new = libc::rlimit {
        rlim_cur: n,
        rlim_max: old.rlim_max,
    };
    // SAFETY: a plain setrlimit call with a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) }, 0);
    old
}

/// Open `/dev/null` until the process has no descriptor left; the files
/// are closed when the returned vector is dropped.
fn exhaust_descriptors() -> Vec<OwnedFd> {
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(OwnedFd::from(f)),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                return held;
            }
        }
    }
}

/// In the root fiber: leave the only worker idle, 200 ms at a time, until
/// it has waited in the I/O driver (`worker_io_waits` past `before`) or
/// 20 s have passed; the count at the end. An idle worker first searches
/// for work, yielding its thread 16 times, before it sleeps: on a loaded
/// machine each yield can last a scheduler slice (a few ms), so the search
/// outlasted every 10 ms idle moment of the first version of these tests,
/// which found the sleeper's deadline passed and never waited (four
/// busy loops beside the test: 0 driver waits in 20 s of 10 ms sleeps,
/// one at once with 200 ms sleeps).
fn idle_until_a_driver_wait(before: u64) -> u64 {
    let start = std::time::Instant::now();
    loop {
        fiber::sleep(ms(200)).unwrap();
        let now = fiber::net::poll_stats().worker_io_waits;
        if now > before || start.elapsed() > std::time::Duration::from_secs(20) {
            return now;
        }
    }
}

/// With `io_park` on and one worker: the worker's first idle moment after
/// the driver started meets a process out of descriptors (its epoll set
/// cannot be made), so it sleeps on its wake-up word that time. Once
/// descriptors are back, its later idle moments must wait in the driver
/// again (`poll_stats().worker_io_waits` grows), as they do when the first
/// attempt succeeds.
// Failed before the fix: a failed IoWaiter creation is cached as None in the worker's OnceLock, so io_park stays off for that worker for good
#[test]
fn io_park_recovers_after_one_failed_driver_wait_setup() {
    in_child("io_park_recovers_after_one_failed_driver_wait_setup", 60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            // Explicit: builder values win over `FIBER_IO_HARVEST=0`.
            .io_harvest(true)
            .io_park(true)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let (before, after) = rt.block_on(|| {
            // The driver starts here (a fresh process: no worker has made
            // its driver wait yet, the I/O layer was not installed).
            let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            assert!(listener.as_raw_fd() >= 0);
            // Without a yield point since: the worker has not been idle.
            let old = set_nofile(256);
            let held = exhaust_descriptors();
            // The only worker goes idle now, out of descriptors.
            fiber::sleep(ms(30)).unwrap();
            drop(held);
            // SAFETY: a plain setrlimit call with a valid struct.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &old) }, 0);
            let before = fiber::net::poll_stats().worker_io_waits;
            (before, idle_until_a_driver_wait(before))
        });
        assert!(
            after > before,
            "the worker never waited in the I/O driver again once descriptors were back \
             ({before} -> {after} driver waits over 20 s of idle sleeps)"
        );
    });
}

/// The same run with descriptors to spare: the idle worker waits in the
/// driver (the control for the test above; it passes on main).
#[test]
fn io_park_worker_waits_in_the_driver_when_its_setup_succeeds() {
    in_child("io_park_worker_waits_in_the_driver_when_its_setup_succeeds", 60, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(1)
            // Explicit: builder values win over `FIBER_IO_HARVEST=0`.
            .io_harvest(true)
            .io_park(true)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let (before, after) = rt.block_on(|| {
            let _listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
            fiber::sleep(ms(30)).unwrap();
            let before = fiber::net::poll_stats().worker_io_waits;
            (before, idle_until_a_driver_wait(before))
        });
        assert!(after > before, "no driver wait in 20 s: {before} -> {after}");
    });
}
