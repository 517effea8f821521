//! Adversarial: `UnixStream::connect` to a listener whose backlog is full.
//! std's (blocking) connect waits until the listener has room; Linux gives
//! a non-blocking one `EAGAIN` and no readiness event later, so fiber's
//! connect must retry rather than fail with `WouldBlock` (on a plain thread
//! and in a fiber), and a cancelled fiber's connect ends.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::{ms, rt, within};

fn socket_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("fiber-backlog-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// Fill the backlog of the listener at `path` with raw non-blocking
/// connects until the kernel refuses one with `EAGAIN`; returns their fds.
fn fill_backlog(path: &Path) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut held = Vec::new();
    loop {
        assert!(held.len() < 100_000, "the backlog never filled");
        // SAFETY: plain socket calls on a descriptor we own; the address is
        // a zeroed sockaddr_un with a path shorter than sun_path.
        unsafe {
            let fd = libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            );
            assert!(fd >= 0);
            let owned = std::os::fd::OwnedFd::from_raw_fd(fd);
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let bytes = path.as_os_str().as_bytes();
            assert!(bytes.len() < addr.sun_path.len());
            for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
                *d = *s as libc::c_char;
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) != 0 {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
                return held;
            }
            held.push(owned);
        }
    }
}

/// With the backlog full, a connect waits; accepting one connection after
/// 100 ms makes room and the connect succeeds.
fn connect_waits_for_room(path: &Path, listener: &std::os::unix::net::UnixListener) {
    let _held = fill_backlog(path);
    let p = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let start = Instant::now();
    std::thread::spawn(move || {
        let r = fiber::net::unix::UnixStream::connect(&p).map(|_| ());
        let _ = tx.send((r.map_err(|e| e.kind()), start.elapsed()));
    });
    // Still waiting (not failed with WouldBlock) after 100 ms.
    assert!(
        rx.recv_timeout(ms(100)).is_err(),
        "the connect returned while the backlog was full"
    );
    let _accepted = listener.accept().unwrap();
    let (r, took) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("connect still waiting after room was made");
    assert_eq!(r, Ok(()));
    assert!(took >= ms(100));
}

#[test]
fn connect_on_a_plain_thread_waits_while_the_backlog_is_full() {
    within(30, || {
        let path = socket_path("thread");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        connect_waits_for_room(&path, &listener);
        let _ = std::fs::remove_file(&path);
    })
}

#[test]
fn connect_in_a_fiber_waits_while_the_backlog_is_full_and_a_cancel_ends_it() {
    within(30, || {
        let path = socket_path("fiber");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let _held = fill_backlog(&path);
        let p = path.clone();
        let (r, took) = rt().block_on(move || {
            let start = Instant::now();
            let r = fiber::with_timeout(ms(100), || fiber::net::unix::UnixStream::connect(&p).map(|_| ()));
            (r, start.elapsed())
        });
        assert!(r.is_err(), "cancelled by the timeout: {r:?}");
        assert!(took >= ms(100) && took < Duration::from_secs(5), "{took:?}");
        // Room made while a fiber waits: it connects.
        let p = path.clone();
        let rt = rt();
        let h = rt.spawn(move || {
            fiber::net::unix::UnixStream::connect(&p)
                .map(|_| ())
                .map_err(|e| e.kind())
        });
        std::thread::sleep(ms(100));
        assert!(
            !h.is_finished(),
            "the fiber's connect returned while the backlog was full"
        );
        let _accepted = listener.accept().unwrap();
        assert_eq!(h.join().unwrap(), Ok(()));
        let _ = std::fs::remove_file(&path);
    })
}
