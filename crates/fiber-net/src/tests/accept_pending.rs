//! An accepted connection whose registration with the poller fails
//! (`epoll_ctl` past `fs.epoll.max_user_watches`) was dropped: the client
//! saw its connection closed, though the caller got only an error. It is
//! kept for the next accept now (plain threads here; the registration
//! failure is injected, per thread).

use crate::driver::tests_fail::fail_next_registration;
use crate::unix::{UnixListener, UnixStream};
use crate::{TcpListener, TcpStream};
use std::io::{Read, Write};

#[test]
fn a_tcp_connection_whose_registration_fails_is_kept_for_the_next_accept() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    fail_next_registration();
    let err = listener.accept().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // Non-blocking: a lost connection fails the test at once instead of
    // waiting for a client that already came.
    listener.set_nonblocking(true).unwrap();
    let (server, peer): (TcpStream, _) = listener.accept().unwrap();
    server.set_nonblocking(false).unwrap();
    assert_eq!(peer, client.local_addr().unwrap());
    client.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    (&server).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
}

#[test]
fn a_unix_connection_whose_registration_fails_is_kept_for_the_next_accept() {
    let dir = std::env::temp_dir().join(format!("fiber-net-accept-pending-{}", std::process::id()));
    let _ = std::fs::remove_file(&dir);
    let listener = UnixListener::bind(&dir).unwrap();
    let mut client = std::os::unix::net::UnixStream::connect(&dir).unwrap();
    fail_next_registration();
    let err = listener.accept().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    listener.set_nonblocking(true).unwrap();
    let (server, _): (UnixStream, _) = listener.accept().unwrap();
    server.set_nonblocking(false).unwrap();
    client.write_all(b"hello").unwrap();
    let mut buf = [0u8; 5];
    (&server).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    let _ = std::fs::remove_file(&dir);
}
