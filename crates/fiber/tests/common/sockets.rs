//! Socket test helpers.

use std::os::fd::RawFd;

/// Make the kernel reset the connection when `fd` is closed (`SO_LINGER`
/// on with a zero timeout): the peer's next read or write fails with
/// `ConnectionReset` or `BrokenPipe` instead of seeing an orderly end.
pub fn reset_on_close(fd: RawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid `linger` for an open socket the caller owns.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "setsockopt(SO_LINGER): {}", std::io::Error::last_os_error());
}

/// A connected pair of fiber TCP streams on loopback: (client, the
/// listener's accepted end). Works in a fiber or on a plain thread.
pub fn tcp_pair() -> (fiber::net::TcpStream, fiber::net::TcpStream) {
    let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = fiber::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

/// [`tcp_pair`] with std's types.
pub fn std_tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

/// A listener whose accept queue is full (backlog 0, filled by
/// connections that are returned with it): a connect to it waits, its
/// SYNs dropped.
pub fn full_listener() -> (std::net::TcpListener, Vec<std::net::TcpStream>) {
    use std::os::fd::AsRawFd;
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: re-listen on an open listening socket to shrink its backlog.
    assert_eq!(unsafe { libc::listen(l.as_raw_fd(), 0) }, 0);
    let a = l.local_addr().unwrap();
    let mut filled = Vec::new();
    for _ in 0..8 {
        match std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_millis(300)) {
            Ok(s) => filled.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return (l, filled),
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the accept queue never filled");
}
