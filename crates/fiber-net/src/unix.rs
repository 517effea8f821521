//! Unix domain sockets: [`UnixListener`], [`UnixStream`] and
//! [`UnixDatagram`], with `std::os::unix::net`'s API; blocking calls park
//! the calling fiber (or block the calling thread) and are cancellation
//! points, as for TCP.

use crate::readiness::{op, OnTimeout, WRITE};
use crate::source::{Io, Pending};
use std::fmt;
use std::io;
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net;
/// std's Unix socket address, which these sockets take and return.
pub use std::os::unix::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// A Unix stream socket server (`std::os::unix::net::UnixListener`).
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_net as net; }
/// use fiber::net::unix::{UnixListener, UnixStream};
/// use std::io::{Read, Write};
///
/// let dir = std::env::temp_dir().join(format!("fiber-net-doc-{}", std::process::id()));
/// let _ = std::fs::remove_file(&dir);
/// let listener = UnixListener::bind(&dir).unwrap();
/// let path = dir.clone();
/// let client = std::thread::spawn(move || UnixStream::connect(path).unwrap().write_all(b"hi").unwrap());
/// let (mut conn, _) = listener.accept().unwrap();
/// let mut got = String::new();
/// conn.read_to_string(&mut got).unwrap();
/// client.join().unwrap();
/// assert_eq!(got, "hi");
/// std::fs::remove_file(&dir).unwrap();
/// ```
pub struct UnixListener {
    io: Io<mio::net::UnixListener>,
    /// An accepted connection whose registration failed (see `Pending`).
    pending: Pending<(mio::net::UnixStream, SocketAddr)>,
}

impl UnixListener {
    /// Bind to `path` and listen.
    pub fn bind<P: AsRef<Path>>(path: P) -> io::Result<UnixListener> {
        Ok(UnixListener {
            io: Io::new(mio::net::UnixListener::bind(path)?)?,
            pending: Pending::new(),
        })
    }

    /// Bind to `addr` (a path or, on Linux, an abstract name) and listen,
    /// like `std::os::unix::net::UnixListener::bind_addr`.
    pub fn bind_addr(addr: &SocketAddr) -> io::Result<UnixListener> {
        Ok(UnixListener {
            io: Io::new(mio::net::UnixListener::bind_addr(addr)?)?,
            pending: Pending::new(),
        })
    }

    /// Accept a connection, parking until one arrives. Once the listener
    /// is shut down (`shutdown(2)` on its descriptor, by any handle) it
    /// fails with `EINVAL`, as std's blocking accept does, waking an
    /// accept parked at that moment.
    #[track_caller]
    pub fn accept(&self) -> io::Result<(UnixStream, SocketAddr)> {
        let pending = self.pending.take();
        let (stream, addr) = match pending {
            Some(pending) => pending,
            None => self.io.read::<op::Accept, _>(|l| match l.accept() {
                // Shut down (`shutdown(2)` on its descriptor): std's blocking
                // accept fails with `EINVAL`; the non-blocking one keeps saying
                // `EAGAIN`, and no further event would wake this one.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.io.read_shut_down() => {
                    Err(io::Error::from_raw_os_error(libc::EINVAL))
                }
                other => other,
            })?,
        };
        // No timeouts inherited: Linux copies a listener's `SO_RCVTIMEO` and
        // `SO_SNDTIMEO` to the TCP sockets it accepts, not to unix ones
        // (std's accepted unix stream has none). A failed registration
        // keeps the connection for the next accept (see `TcpListener`).
        let io = match Io::try_new(stream) {
            Ok(io) => io,
            Err((e, stream)) => {
                self.pending.put((stream, addr));
                return Err(e);
            }
        };
        Ok((UnixStream { io }, addr))
    }

    /// An endless iterator over accepted connections.
    #[track_caller]
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// A second handle (a duplicated fd with its own registration). As in
    /// std, options set on one handle (timeouts, non-blocking mode) apply
    /// to both.
    #[track_caller]
    pub fn try_clone(&self) -> io::Result<UnixListener> {
        let fd = self.io.get().as_fd().try_clone_to_owned()?;
        let mut clone = UnixListener::from_std(net::UnixListener::from(fd))?;
        clone.io.share_settings(&self.io);
        Ok(clone)
    }

    /// Take the pending `SO_ERROR`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.io.get().take_error()
    }

    /// With `true`, `accept` returns `WouldBlock` instead of parking.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.io.set_nonblocking(nonblocking);
        Ok(())
    }

    /// Adopt a std listener.
    /// Non-blocking mode belongs to the socket, not to one handle: a std
    /// handle cloned from it before (`try_clone`) is non-blocking from now
    /// on too, and its calls return `WouldBlock` instead of waiting.
    pub fn from_std(listener: net::UnixListener) -> io::Result<UnixListener> {
        listener.set_nonblocking(true)?;
        let io = Io::new(mio::net::UnixListener::from_std(listener))?;
        // `SO_RCVTIMEO` set on it bounds `accept` (as std's); unlike TCP's,
        // it does not go to the sockets it accepts.
        io.adopt_kernel_timeouts()?;
        Ok(UnixListener {
            io,
            pending: Pending::new(),
        })
    }

    /// Back to a std listener, in blocking mode.
    ///
    /// Unless a handle made from this one with `try_clone` is still open:
    /// blocking mode belongs to the socket, which the handles share, and
    /// it would make their calls block the thread instead of parking the
    /// fiber, so the socket stays non-blocking (call `set_nonblocking(false)`
    /// on it once they are gone).
    pub fn into_std(self) -> io::Result<net::UnixListener> {
        let blocking = self.io.hand_back_blocking();
        let listener = net::UnixListener::from(self.io.into_inner());
        if blocking {
            listener.set_nonblocking(false)?;
        }
        Ok(listener)
    }
}

/// Run a non-blocking Unix `connect` until the listener's backlog has room.
/// Linux refuses such a connect with `EAGAIN` and reports no readiness when
/// room appears (a blocking connect, std's, sleeps in the kernel instead),
/// so the attempt is repeated after a pause that doubles from 50 µs up to
/// 10 ms: a fiber parks for it (a cancellable wait), a plain thread sleeps.
#[track_caller]
fn retry_while_backlog_full(
    mut attempt: impl FnMut() -> io::Result<mio::net::UnixStream>,
) -> io::Result<mio::net::UnixStream> {
    let mut pause = Duration::from_micros(50);
    loop {
        match attempt() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            other => return other,
        }
        if fiber_core::in_fiber() {
            let until = std::time::Instant::now() + pause;
            if fiber_core::wait_until(Some(until), fiber_core::Interrupt::Cancellable)
                == fiber_core::WaitResult::Cancelled
            {
                return Err(io::Error::other(fiber_core::Cancelled));
            }
        } else {
            std::thread::sleep(pause);
        }
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// A Unix stream connection (`std::os::unix::net::UnixStream`); `Read` and
/// `Write` for `UnixStream` and `&UnixStream`.
pub struct UnixStream {
    io: Io<mio::net::UnixStream>,
}

impl UnixStream {
    /// Connect to the socket at `path`. As with std, a listener whose
    /// backlog is full makes the call wait until it has room (a fiber
    /// parks; a cancellation ends the wait with an error of kind `Other`
    /// holding `Cancelled`).
    #[track_caller]
    pub fn connect<P: AsRef<Path>>(path: P) -> io::Result<UnixStream> {
        let path = path.as_ref();
        UnixStream::connected(retry_while_backlog_full(|| mio::net::UnixStream::connect(path))?)
    }

    /// Connect to `addr` (a path or, on Linux, an abstract name), like
    /// `std::os::unix::net::UnixStream::connect_addr` (waiting, as
    /// [`connect`](Self::connect) does, while the listener's backlog is
    /// full).
    #[track_caller]
    pub fn connect_addr(addr: &SocketAddr) -> io::Result<UnixStream> {
        UnixStream::connected(retry_while_backlog_full(|| mio::net::UnixStream::connect_addr(addr))?)
    }

    /// Register a socket whose connect was started and wait for it to end.
    #[track_caller]
    fn connected(socket: mio::net::UnixStream) -> io::Result<UnixStream> {
        let stream = UnixStream { io: Io::new(socket)? };
        stream
            .io
            .poll::<op::Connect, _>(WRITE, None, OnTimeout::TimedOut, |s| {
                if let Some(e) = s.take_error()? {
                    return Err(e);
                }
                match s.peer_addr() {
                    Ok(_) => Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => Err(io::ErrorKind::WouldBlock.into()),
                    Err(e) => Err(e),
                }
            })?;
        Ok(stream)
    }

    /// A connected pair.
    pub fn pair() -> io::Result<(UnixStream, UnixStream)> {
        let (a, b) = mio::net::UnixStream::pair()?;
        Ok((UnixStream { io: Io::new(a)? }, UnixStream { io: Io::new(b)? }))
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// Shut down one or both halves. As in std, a write parked on this
    /// socket (another fiber, or a thread, on this handle or on one
    /// `try_clone` made) then fails with `BrokenPipe`, and a parked read
    /// returns `Ok(0)`.
    ///
    /// The peer's `shutdown(Read)` is different: the kernel's readiness
    /// events report nothing for it on this side, so a write parked on a
    /// full buffer here stays parked until the peer reads, closes, or the
    /// write's timeout or a cancellation ends it (std's blocked write
    /// fails with `BrokenPipe` instead; tokio's and Go's, which also wait
    /// for readiness, wait as this one does). A write made after the
    /// peer's `shutdown(Read)` fails at once.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.get().shutdown(how)?;
        if how != Shutdown::Write {
            // Reads now end at once, with no data arriving.
            self.io.forget_drained();
        }
        if how != Shutdown::Read {
            // A write parked on a full buffer fails now (`BrokenPipe`).
            self.io.wake_writers();
        }
        Ok(())
    }

    /// A second handle (a duplicated fd with its own registration). As in
    /// std, options set on one handle (timeouts, non-blocking mode) apply
    /// to both.
    #[track_caller]
    pub fn try_clone(&self) -> io::Result<UnixStream> {
        let fd = self.io.get().as_fd().try_clone_to_owned()?;
        let mut clone = UnixStream::from_std(net::UnixStream::from(fd))?;
        clone.io.share_settings(&self.io);
        Ok(clone)
    }

    /// Set the read timeout (expiry: `WouldBlock`, as std on Linux).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.set_read_timeout(timeout)
    }

    /// Set the write timeout.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.set_write_timeout(timeout)
    }

    /// The read timeout.
    #[track_caller]
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.io.read_timeout())
    }

    /// The write timeout.
    #[track_caller]
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.io.write_timeout())
    }

    /// Take the pending `SO_ERROR`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.io.get().take_error()
    }

    /// With `true`, calls return `WouldBlock` instead of parking.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.io.set_nonblocking(nonblocking);
        Ok(())
    }

    /// Adopt a std stream.
    /// Non-blocking mode belongs to the socket, not to one handle: a std
    /// handle cloned from it before (`try_clone`) is non-blocking from now
    /// on too, and its calls return `WouldBlock` instead of waiting.
    pub fn from_std(stream: net::UnixStream) -> io::Result<UnixStream> {
        // Timeouts set on the std socket (`SO_RCVTIMEO`/`SO_SNDTIMEO`) stay
        // in force: a non-blocking socket ignores them, so they become
        // this handle's.
        let (read, write) = (stream.read_timeout()?, stream.write_timeout()?);
        stream.set_nonblocking(true)?;
        let io = Io::new(mio::net::UnixStream::from_std(stream))?;
        io.set_read_timeout(read)?;
        io.set_write_timeout(write)?;
        Ok(UnixStream { io })
    }

    /// Back to a std stream, in blocking mode.
    ///
    /// Unless a handle made from this one with `try_clone` is still open:
    /// blocking mode belongs to the socket, which the handles share, and
    /// it would make their calls block the thread instead of parking the
    /// fiber, so the socket stays non-blocking (call `set_nonblocking(false)`
    /// on it once they are gone).
    pub fn into_std(self) -> io::Result<net::UnixStream> {
        let blocking = self.io.hand_back_blocking();
        let stream = net::UnixStream::from(self.io.into_inner());
        if blocking {
            stream.set_nonblocking(false)?;
        }
        Ok(stream)
    }
}

crate::stream_io!(UnixStream, short_read_drains = false);

/// A Unix datagram socket (`std::os::unix::net::UnixDatagram`).
pub struct UnixDatagram {
    io: Io<mio::net::UnixDatagram>,
}

impl UnixDatagram {
    /// Bind to `path`.
    pub fn bind<P: AsRef<Path>>(path: P) -> io::Result<UnixDatagram> {
        Ok(UnixDatagram {
            io: Io::new(mio::net::UnixDatagram::bind(path)?)?,
        })
    }

    /// Bind to `addr` (a path or, on Linux, an abstract name), like
    /// `std::os::unix::net::UnixDatagram::bind_addr`.
    pub fn bind_addr(addr: &SocketAddr) -> io::Result<UnixDatagram> {
        Ok(UnixDatagram {
            io: Io::new(mio::net::UnixDatagram::bind_addr(addr)?)?,
        })
    }

    /// A socket bound to no address.
    pub fn unbound() -> io::Result<UnixDatagram> {
        Ok(UnixDatagram {
            io: Io::new(mio::net::UnixDatagram::unbound()?)?,
        })
    }

    /// A connected pair.
    pub fn pair() -> io::Result<(UnixDatagram, UnixDatagram)> {
        let (a, b) = mio::net::UnixDatagram::pair()?;
        Ok((UnixDatagram { io: Io::new(a)? }, UnixDatagram { io: Io::new(b)? }))
    }

    /// Set the default peer.
    #[track_caller]
    pub fn connect<P: AsRef<Path>>(&self, path: P) -> io::Result<()> {
        self.io.get().connect(path)
    }

    /// Set the default peer to `addr`, like
    /// `std::os::unix::net::UnixDatagram::connect_addr`.
    pub fn connect_addr(&self, addr: &SocketAddr) -> io::Result<()> {
        self.with_std(|s| s.connect_addr(addr))
    }

    /// Send to `addr`, parking while the send buffer is full, like
    /// `std::os::unix::net::UnixDatagram::send_to_addr`.
    pub fn send_to_addr(&self, buf: &[u8], addr: &SocketAddr) -> io::Result<usize> {
        self.io
            .write::<op::Send, _>(|_| self.with_std(|s| s.send_to_addr(buf, addr)))
    }

    /// A std view of this socket's fd for the calls mio lacks (the view
    /// does not close the fd).
    fn with_std<R>(&self, f: impl FnOnce(&net::UnixDatagram) -> R) -> R {
        use std::os::fd::FromRawFd;
        // SAFETY: the fd is open and owned by `self.io` for the whole call
        // (`self` is borrowed); `ManuallyDrop` keeps the view from closing
        // it, and the view is not leaked out of `f`'s borrow.
        let view = std::mem::ManuallyDrop::new(unsafe { net::UnixDatagram::from_raw_fd(self.as_raw_fd()) });
        f(&view)
    }

    /// Send to `path`.
    #[track_caller]
    pub fn send_to<P: AsRef<Path>>(&self, buf: &[u8], path: P) -> io::Result<usize> {
        let path = path.as_ref();
        self.io.write::<op::Send, _>(|s| s.send_to(buf, path))
    }

    /// Receive one datagram, parking until one arrives. After
    /// `shutdown(Read)` (by this handle or a clone) it returns `Ok(0)` at
    /// once, with an unnamed address, as std's blocking socket does.
    #[track_caller]
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.io.read::<op::Recv, _>(|s| match s.recv_from(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.io.read_shut_down() => {
                // At once, every time: a loop on it is polling.
                fiber_core::poll_missed();
                Ok((0, net::UnixDatagram::unbound()?.local_addr()?))
            }
            other => other,
        })
    }

    /// Send to the connected peer.
    #[track_caller]
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.io.write::<op::Send, _>(|s| s.send(buf))
    }

    /// Receive from the connected peer (`Ok(0)` after `shutdown(Read)`, as
    /// [`recv_from`](Self::recv_from)).
    #[track_caller]
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read::<op::Recv, _>(|s| match s.recv(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.io.read_shut_down() => {
                // At once, every time: a loop on it is polling.
                fiber_core::poll_missed();
                Ok(0)
            }
            other => other,
        })
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// The connected peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// Set the receive timeout (expiry: `WouldBlock`).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.set_read_timeout(timeout)
    }

    /// Set the send timeout.
    pub fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.set_write_timeout(timeout)
    }

    /// The receive timeout.
    #[track_caller]
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.io.read_timeout())
    }

    /// The send timeout.
    #[track_caller]
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.io.write_timeout())
    }

    /// With `true`, calls return `WouldBlock` instead of parking.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.io.set_nonblocking(nonblocking);
        Ok(())
    }

    /// Take the pending `SO_ERROR`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.io.get().take_error()
    }

    /// A second handle (a duplicated fd with its own registration). As in
    /// std, options set on one handle (timeouts, non-blocking mode) apply
    /// to both.
    #[track_caller]
    pub fn try_clone(&self) -> io::Result<UnixDatagram> {
        let fd = self.io.get().as_fd().try_clone_to_owned()?;
        let mut clone = UnixDatagram::from_std(net::UnixDatagram::from(fd))?;
        clone.io.share_settings(&self.io);
        Ok(clone)
    }

    /// Shut down one or both directions. As in std, a send parked on this
    /// socket (a full receiver; on this handle or on one `try_clone` made)
    /// then fails with `BrokenPipe`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.get().shutdown(how)?;
        if how != Shutdown::Read {
            // A send parked on a full receiver fails now (`BrokenPipe`).
            self.io.wake_writers();
        }
        Ok(())
    }

    /// Adopt a std socket.
    /// Non-blocking mode belongs to the socket, not to one handle: a std
    /// handle cloned from it before (`try_clone`) is non-blocking from now
    /// on too, and its calls return `WouldBlock` instead of waiting.
    pub fn from_std(socket: net::UnixDatagram) -> io::Result<UnixDatagram> {
        // Timeouts set on the std socket (`SO_RCVTIMEO`/`SO_SNDTIMEO`) stay
        // in force: a non-blocking socket ignores them, so they become
        // this handle's.
        let (read, write) = (socket.read_timeout()?, socket.write_timeout()?);
        socket.set_nonblocking(true)?;
        let io = Io::new(mio::net::UnixDatagram::from_std(socket))?;
        io.set_read_timeout(read)?;
        io.set_write_timeout(write)?;
        Ok(UnixDatagram { io })
    }

    /// Back to a std socket, in blocking mode.
    ///
    /// Unless a handle made from this one with `try_clone` is still open:
    /// blocking mode belongs to the socket, which the handles share, and
    /// it would make their calls block the thread instead of parking the
    /// fiber, so the socket stays non-blocking (call `set_nonblocking(false)`
    /// on it once they are gone).
    pub fn into_std(self) -> io::Result<net::UnixDatagram> {
        let blocking = self.io.hand_back_blocking();
        let socket = net::UnixDatagram::from(self.io.into_inner());
        if blocking {
            socket.set_nonblocking(false)?;
        }
        Ok(socket)
    }
}

macro_rules! fd_impls {
    ($($t:ident),*) => {$(
        impl AsRawFd for $t {
            fn as_raw_fd(&self) -> RawFd {
                self.io.get().as_raw_fd()
            }
        }

        impl AsFd for $t {
            fn as_fd(&self) -> BorrowedFd<'_> {
                self.io.get().as_fd()
            }
        }

        impl From<$t> for OwnedFd {
            fn from(socket: $t) -> OwnedFd {
                socket.io.into_owned_fd()
            }
        }
    )*};
}

fd_impls!(UnixListener, UnixStream, UnixDatagram);

// As std prints them: the descriptor, then each address only when known.
fn debug_unix(
    f: &mut fmt::Formatter<'_>,
    name: &str,
    fd: RawFd,
    local: io::Result<SocketAddr>,
    peer: Option<io::Result<SocketAddr>>,
) -> fmt::Result {
    let mut d = f.debug_struct(name);
    d.field("fd", &fd);
    if let Ok(addr) = local {
        d.field("local", &addr);
    }
    if let Some(Ok(addr)) = peer {
        d.field("peer", &addr);
    }
    d.finish()
}

/// The iterator of [`UnixListener::incoming`] (std's
/// `std::os::unix::net::Incoming`): never returns `None`.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a UnixListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<UnixStream>;
    #[track_caller]
    fn next(&mut self) -> Option<io::Result<UnixStream>> {
        Some(self.listener.accept().map(|(stream, _)| stream))
    }
}

/// As std's: it never returns `None`, so it is fused.
impl std::iter::FusedIterator for Incoming<'_> {}

/// `for stream in &listener`, as std's `UnixListener`.
impl<'a> IntoIterator for &'a UnixListener {
    type Item = io::Result<UnixStream>;
    type IntoIter = Incoming<'a>;

    #[track_caller]
    fn into_iter(self) -> Incoming<'a> {
        self.incoming()
    }
}

impl fmt::Debug for UnixListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_unix(f, "UnixListener", self.as_raw_fd(), self.local_addr(), None)
    }
}

impl fmt::Debug for UnixStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_unix(
            f,
            "UnixStream",
            self.as_raw_fd(),
            self.local_addr(),
            Some(self.peer_addr()),
        )
    }
}

impl fmt::Debug for UnixDatagram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug_unix(
            f,
            "UnixDatagram",
            self.as_raw_fd(),
            self.local_addr(),
            Some(self.peer_addr()),
        )
    }
}

#[cfg(not(loom))]
adopt_fd!(UnixListener, net::UnixListener);
#[cfg(not(loom))]
adopt_fd!(UnixStream, net::UnixStream);
#[cfg(not(loom))]
adopt_fd!(UnixDatagram, net::UnixDatagram);
