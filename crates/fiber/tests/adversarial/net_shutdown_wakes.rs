//! Adversarial: a socket shut down while a fiber (or a plain thread) is
//! parked on it. std's blocked call returns at once; on Linux the
//! non-blocking form of the same call keeps saying `EAGAIN` after the
//! shutdown and no further readiness event comes, so a parked call that
//! only retried stayed parked for ever:
//!
//! - an accept on a unix listener shut down with `shutdown(2)` (std:
//!   `EINVAL`; a TCP listener's non-blocking accept already fails so);
//! - a receive on a UDP socket shut down for reading (std: `recv` and
//!   `peek` return 0, `recv_from` and `peek_from` fail with
//!   `InvalidInput`);
//! - a write parked on one handle of a unix socket when another handle of
//!   it (`try_clone`) shuts down writing (std: `BrokenPipe`; a unix
//!   socket's poll reports nothing for a send shutdown).
//!
//! Each case waits until the call is parked before the shutdown.

use std::io::{ErrorKind, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{ms, wait_parked, within, write_until_error};

fn shutdown_fd(fd: std::os::fd::RawFd, how: libc::c_int) -> i32 {
    // SAFETY: `fd` belongs to a socket the caller keeps open for the call.
    unsafe { libc::shutdown(fd, how) }
}

fn temp_path(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("fiber-shutdown-wakes-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

#[test]
fn a_unix_listener_shut_down_fails_a_parked_accept() {
    within(30, || {
        for how in [libc::SHUT_RDWR, libc::SHUT_RD] {
            let rt = crate::common::rt_fixed_grace(2, ms(300));
            let path = temp_path(&format!("accept-{how}"));
            let listener = Arc::new(fiber::net::unix::UnixListener::bind(&path).unwrap());
            let l2 = listener.clone();
            let h = rt.spawn(move || l2.accept().map(|_| ()).map_err(|e| e.raw_os_error()));
            wait_parked(&rt, 1);
            assert_eq!(shutdown_fd(listener.as_raw_fd(), how), 0);
            assert_eq!(h.join().unwrap(), Err(Some(libc::EINVAL)), "shutdown {how}");
            let _ = std::fs::remove_file(&path);
        }
    });
}

#[test]
fn a_unix_listener_shut_down_fails_an_accept_on_a_plain_thread() {
    within(30, || {
        let path = temp_path("accept-thread");
        let listener = Arc::new(fiber::net::unix::UnixListener::bind(&path).unwrap());
        let l2 = listener.clone();
        let t = std::thread::spawn(move || l2.accept().map(|_| ()).map_err(|e| e.raw_os_error()));
        // Parked or not yet: the answer is the same either way.
        std::thread::sleep(ms(50));
        assert_eq!(shutdown_fd(listener.as_raw_fd(), libc::SHUT_RDWR), 0);
        assert_eq!(t.join().unwrap(), Err(Some(libc::EINVAL)));
        let _ = std::fs::remove_file(&path);
    });
}

#[test]
fn a_udp_socket_shut_down_for_reading_ends_a_parked_receive() {
    within(30, || {
        for op in ["recv", "peek", "recv_from", "peek_from"] {
            let rt = crate::common::rt_fixed_grace(2, ms(300));
            let socket = Arc::new(fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap());
            socket.connect(socket.local_addr().unwrap()).unwrap();
            let s2 = socket.clone();
            let h = rt.spawn(move || {
                let mut buf = [0u8; 8];
                match op {
                    "recv" => s2.recv(&mut buf),
                    "peek" => s2.peek(&mut buf),
                    "recv_from" => s2.recv_from(&mut buf).map(|(n, _)| n),
                    _ => s2.peek_from(&mut buf).map(|(n, _)| n),
                }
                .map_err(|e| e.kind())
            });
            wait_parked(&rt, 1);
            assert_eq!(shutdown_fd(socket.as_raw_fd(), libc::SHUT_RD), 0);
            let expected = if op.ends_with("_from") {
                Err(ErrorKind::InvalidInput)
            } else {
                Ok(0)
            };
            assert_eq!(h.join().unwrap(), expected, "{op}");
            // A datagram queued after the shutdown is still delivered, as
            // with std (the shutdown only ends waits on an empty queue).
            socket.send(b"late").unwrap();
            let mut buf = [0u8; 8];
            let got = socket.recv(&mut buf);
            assert!(matches!(got, Ok(0) | Ok(4)), "{op}: {got:?}");
        }
    });
}

#[test]
fn a_write_shutdown_through_a_clone_fails_a_parked_unix_write() {
    within(30, || {
        for through_clone in [true, false] {
            let rt = crate::common::rt_fixed_grace(2, ms(300));
            let (a, _b) = fiber::net::unix::UnixStream::pair().unwrap();
            let clone = a.try_clone().unwrap();
            let (writer, shutter) = if through_clone { (a, clone) } else { (clone, a) };
            let h = rt.spawn(move || write_until_error(|| (&writer).write(&[0u8; 65536])));
            wait_parked(&rt, 1);
            shutter.shutdown(Shutdown::Write).unwrap();
            assert_eq!(
                h.join().unwrap(),
                ErrorKind::BrokenPipe,
                "stream, through clone {through_clone}"
            );

            let (d, _e) = fiber::net::unix::UnixDatagram::pair().unwrap();
            let clone = d.try_clone().unwrap();
            let (writer, shutter) = if through_clone { (d, clone) } else { (clone, d) };
            let h = rt.spawn(move || write_until_error(|| writer.send(&[0u8; 1000])));
            wait_parked(&rt, 1);
            shutter.shutdown(Shutdown::Write).unwrap();
            assert_eq!(
                h.join().unwrap(),
                ErrorKind::BrokenPipe,
                "datagram, through clone {through_clone}"
            );
        }
    });
}

/// A socket timeout reads back as the kernel keeps it, as std's getter
/// reports it: a very long one is finite on a kernel whose clock tick is
/// under 1,000 Hz, where it was reported as none.
#[test]
fn a_very_long_socket_timeout_reads_back_as_std_reads_it() {
    within(30, || {
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = fiber::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let std_side = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        for secs in [i64::MAX as u64 / 1000, i64::MAX as u64 / 250 - 2, 86_400 * 365] {
            let d = Some(Duration::from_secs(secs));
            ours.set_read_timeout(d).unwrap();
            ours.set_write_timeout(d).unwrap();
            std_side.set_read_timeout(d).unwrap();
            std_side.set_write_timeout(d).unwrap();
            assert_eq!(
                ours.read_timeout().unwrap(),
                std_side.read_timeout().unwrap(),
                "{secs} s"
            );
            assert_eq!(
                ours.write_timeout().unwrap(),
                std_side.write_timeout().unwrap(),
                "{secs} s"
            );
        }
        ours.set_read_timeout(Some(Duration::MAX)).unwrap();
        std_side.set_read_timeout(Some(Duration::MAX)).unwrap();
        assert_eq!(
            ours.read_timeout().unwrap(),
            std_side.read_timeout().unwrap(),
            "Duration::MAX"
        );
    });
}
