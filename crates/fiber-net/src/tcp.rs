//! TCP: [`TcpListener`] and [`TcpStream`], with `std::net`'s API.

use crate::readiness::{op, OnTimeout, WRITE};
use crate::source::{Io, Pending};
use std::fmt;
use std::io;
use std::net::{self, Shutdown, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Try `f` on each address `addr` resolves to, as std does; the last error
/// wins, except a cancellation, which ends the call at once (a cancelled
/// fiber does not go on to connect to the next address). Name resolution
/// (`getaddrinfo`) blocks the calling thread: pass a [`SocketAddr`] from
/// fibers that must not block, or resolve on the blocking pool.
pub(crate) fn each_addr<A: ToSocketAddrs, T>(addr: A, mut f: impl FnMut(SocketAddr) -> io::Result<T>) -> io::Result<T> {
    let mut last = None;
    for addr in addr.to_socket_addrs()? {
        match f(addr) {
            Ok(t) => return Ok(t),
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<fiber_core::Cancelled>()) => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "could not resolve to any addresses")))
}

/// A TCP socket server, listening for connections: `std::net::TcpListener`
/// whose `accept` parks the calling fiber (or blocks the calling thread).
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_net as net; }
/// use fiber::net::{TcpListener, TcpStream};
/// use std::io::{Read, Write};
///
/// let listener = TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = listener.local_addr().unwrap();
/// let client = std::thread::spawn(move || {
///     let mut stream = TcpStream::connect(addr).unwrap();
///     stream.write_all(b"ping").unwrap();
/// });
/// let (mut stream, _) = listener.accept().unwrap();
/// let mut buf = [0; 4];
/// stream.read_exact(&mut buf).unwrap();
/// assert_eq!(&buf, b"ping");
/// client.join().unwrap();
/// ```
pub struct TcpListener {
    io: Io<mio::net::TcpListener>,
    /// An accepted connection whose registration failed (see `Pending`).
    pending: Pending<(mio::net::TcpStream, SocketAddr)>,
}

impl TcpListener {
    /// Bind to `addr` (each resolved address in turn) and listen, with
    /// `SO_REUSEADDR` as std sets it.
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<TcpListener> {
        let listener = each_addr(addr, mio::net::TcpListener::bind)?;
        Ok(TcpListener {
            io: Io::new(listener)?,
            pending: Pending::new(),
        })
    }

    /// Accept a connection, parking until one arrives. A cancellation point:
    /// a cancelled wait is an error of kind `Other` wrapping
    /// [`fiber_core::Cancelled`].
    #[track_caller]
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (stream, addr) = match self.pending.take() {
            Some(pending) => pending,
            None => self.io.read::<op::Accept, _>(|l| l.accept())?,
        };
        // A failed registration keeps the connection for the next accept
        // (the kernel already took it off the queue).
        let io = Io::try_new(stream).map_err(|(e, stream)| {
            self.pending.put((stream, addr));
            e
        })?;
        io.inherit_timeouts(&self.io);
        Ok((TcpStream { io }, addr))
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

    /// A second handle on the same socket (a duplicated fd with its own
    /// registration): accepts on either handle take from one queue. As in
    /// std, options set on one handle (non-blocking mode) apply to both.
    #[track_caller]
    pub fn try_clone(&self) -> io::Result<TcpListener> {
        let fd = self.io.get().as_fd().try_clone_to_owned()?;
        let mut clone = TcpListener::from_std(net::TcpListener::from(fd))?;
        clone.io.share_settings(&self.io);
        Ok(clone)
    }

    /// Set `IP_TTL`.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.io.get().set_ttl(ttl)
    }

    /// `IP_TTL`.
    pub fn ttl(&self) -> io::Result<u32> {
        self.io.get().ttl()
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

    /// Adopt a std listener (switched to non-blocking mode internally).
    /// Non-blocking mode belongs to the socket, not to one handle: a std
    /// handle cloned from it before (`try_clone`) is non-blocking from now
    /// on too, and its calls return `WouldBlock` instead of waiting.
    pub fn from_std(listener: net::TcpListener) -> io::Result<TcpListener> {
        listener.set_nonblocking(true)?;
        let io = Io::new(mio::net::TcpListener::from_std(listener))?;
        // `SO_RCVTIMEO` set on it bounds `accept` (as std's), and goes to
        // the sockets it accepts.
        io.adopt_kernel_timeouts()?;
        Ok(TcpListener {
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
    pub fn into_std(self) -> io::Result<net::TcpListener> {
        let blocking = self.io.hand_back_blocking();
        let listener = net::TcpListener::from(self.io.into_inner());
        if blocking {
            listener.set_nonblocking(false)?;
        }
        Ok(listener)
    }
}

impl fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As std prints it: each address only when known.
        let mut d = f.debug_struct("TcpListener");
        if let Ok(addr) = self.local_addr() {
            d.field("addr", &addr);
        }
        d.field("fd", &self.as_raw_fd()).finish()
    }
}

impl AsRawFd for TcpListener {
    fn as_raw_fd(&self) -> RawFd {
        self.io.get().as_raw_fd()
    }
}

impl AsFd for TcpListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.get().as_fd()
    }
}

impl TryFrom<net::TcpListener> for TcpListener {
    type Error = io::Error;
    fn try_from(listener: net::TcpListener) -> io::Result<TcpListener> {
        TcpListener::from_std(listener)
    }
}

impl From<TcpListener> for OwnedFd {
    fn from(listener: TcpListener) -> OwnedFd {
        listener.io.into_owned_fd()
    }
}

/// The iterator of [`TcpListener::incoming`]: never returns `None`.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a TcpListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<TcpStream>;
    #[track_caller]
    fn next(&mut self) -> Option<io::Result<TcpStream>> {
        Some(self.listener.accept().map(|(stream, _)| stream))
    }
}

/// As std's: it never returns `None`, so it is fused.
impl std::iter::FusedIterator for Incoming<'_> {}

/// A TCP connection: `std::net::TcpStream` whose blocking calls park the
/// calling fiber (or block the calling thread). `Read` and `Write` are
/// implemented for `TcpStream` and `&TcpStream`, so one fiber can read
/// while another writes (share a reference, or use [`try_clone`]).
///
/// Every blocking call is a cancellation point: a cancelled wait returns an
/// error of kind `Other` whose inner error is [`fiber_core::Cancelled`]
/// (never `Interrupted`, which `read_exact` and `write_all` would retry).
///
/// [`try_clone`]: TcpStream::try_clone
pub struct TcpStream {
    io: Io<mio::net::TcpStream>,
}

impl TcpStream {
    /// Connect to `addr` (each resolved address in turn), parking until the
    /// handshake completes.
    #[track_caller]
    pub fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<TcpStream> {
        each_addr(addr, |addr| TcpStream::connect_deadline(addr, None))
    }

    /// Connect with a timeout: an error of kind `TimedOut` when it expires
    /// (a zero timeout is `InvalidInput`, as in std).
    #[track_caller]
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ));
        }
        TcpStream::connect_deadline(*addr, Instant::now().checked_add(timeout))
    }

    #[track_caller]
    fn connect_deadline(addr: SocketAddr, deadline: Option<Instant>) -> io::Result<TcpStream> {
        let stream = TcpStream {
            io: Io::new(mio::net::TcpStream::connect(addr)?)?,
        };
        // The handshake is done when the socket turns writable; SO_ERROR
        // then tells how it ended. Before that, `peer_addr` is NotConnected.
        stream
            .io
            .poll::<op::Connect, _>(WRITE, deadline, OnTimeout::TimedOut, |s| {
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

    /// The remote address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// Shut down the read half, the write half or both. Fibers parked in a
    /// read on this connection wake and read end-of-file.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.io.get().shutdown(how)?;
        if how != Shutdown::Write {
            // Reads now end at once, with no data arriving.
            self.io.forget_drained();
        }
        Ok(())
    }

    /// A second handle on the same connection (a duplicated fd with its own
    /// registration), for a reader fiber and a writer fiber. As in std,
    /// options set on one handle (timeouts, non-blocking mode, socket
    /// options) apply to both.
    #[track_caller]
    pub fn try_clone(&self) -> io::Result<TcpStream> {
        let fd = self.io.get().as_fd().try_clone_to_owned()?;
        let mut clone = TcpStream::from_std(net::TcpStream::from(fd))?;
        clone.io.share_settings(&self.io);
        Ok(clone)
    }

    /// Read without consuming, parking until data (or end-of-file) is there.
    #[track_caller]
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let len = buf.len();
        let peeked = self.io.read::<op::Read, _>(|s| s.peek(buf));
        if len == 0 {
            // As `read`: an empty buffer's expired timeout is `Ok(0)`.
            return self.io.empty_read(peeked);
        }
        if matches!(peeked, Ok(0)) {
            // End of file, at once and on every later call: a loop that
            // peeks on is polling (as `read` at end of file).
            fiber_core::poll_missed();
        }
        peeked
    }

    /// Set the read timeout; an expired read is an error of kind
    /// `WouldBlock` (`EAGAIN`, as std on Linux). `Some(0)` is
    /// `InvalidInput`.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.set_read_timeout(timeout)
    }

    /// Set the write timeout (as [`set_read_timeout`](Self::set_read_timeout)).
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

    /// Set `TCP_NODELAY`.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.io.get().set_nodelay(nodelay)
    }

    /// `TCP_NODELAY`.
    pub fn nodelay(&self) -> io::Result<bool> {
        self.io.get().nodelay()
    }

    /// Set `IP_TTL`.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.io.get().set_ttl(ttl)
    }

    /// `IP_TTL`.
    pub fn ttl(&self) -> io::Result<u32> {
        self.io.get().ttl()
    }

    /// Take the pending `SO_ERROR`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.io.get().take_error()
    }

    /// With `true`, reads and writes return `WouldBlock` instead of parking.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.io.set_nonblocking(nonblocking);
        Ok(())
    }

    /// Adopt a std stream (switched to non-blocking mode internally). The
    /// stream should be connected.
    /// Non-blocking mode belongs to the socket, not to one handle: a std
    /// handle cloned from it before (`try_clone`) is non-blocking from now
    /// on too, and its calls return `WouldBlock` instead of waiting.
    pub fn from_std(stream: net::TcpStream) -> io::Result<TcpStream> {
        // Timeouts set on the std socket (`SO_RCVTIMEO`/`SO_SNDTIMEO`) stay
        // in force: a non-blocking socket ignores them, so they become
        // this handle's.
        let (read, write) = (stream.read_timeout()?, stream.write_timeout()?);
        stream.set_nonblocking(true)?;
        let io = Io::new(mio::net::TcpStream::from_std(stream))?;
        io.set_read_timeout(read)?;
        io.set_write_timeout(write)?;
        Ok(TcpStream { io })
    }

    /// Back to a std stream, in blocking mode. The timeouts set here stay
    /// on the socket: they are the kernel's `SO_RCVTIMEO` / `SO_SNDTIMEO`,
    /// which the std stream then obeys.
    ///
    /// Unless a handle made from this one with `try_clone` is still open:
    /// blocking mode belongs to the socket, which the handles share, and
    /// it would make their calls block the thread instead of parking the
    /// fiber, so the socket stays non-blocking (call `set_nonblocking(false)`
    /// on it once they are gone).
    pub fn into_std(self) -> io::Result<net::TcpStream> {
        let blocking = self.io.hand_back_blocking();
        let stream = net::TcpStream::from(self.io.into_inner());
        if blocking {
            stream.set_nonblocking(false)?;
        }
        Ok(stream)
    }
}

crate::stream_io!(TcpStream, short_read_drains = true);

impl fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As std prints it: each address only when known.
        let mut d = f.debug_struct("TcpStream");
        if let Ok(addr) = self.local_addr() {
            d.field("addr", &addr);
        }
        if let Ok(peer) = self.peer_addr() {
            d.field("peer", &peer);
        }
        d.field("fd", &self.as_raw_fd()).finish()
    }
}

impl AsRawFd for TcpStream {
    fn as_raw_fd(&self) -> RawFd {
        self.io.get().as_raw_fd()
    }
}

impl AsFd for TcpStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.get().as_fd()
    }
}

impl TryFrom<net::TcpStream> for TcpStream {
    type Error = io::Error;
    fn try_from(stream: net::TcpStream) -> io::Result<TcpStream> {
        TcpStream::from_std(stream)
    }
}

impl From<TcpStream> for OwnedFd {
    fn from(stream: TcpStream) -> OwnedFd {
        stream.io.into_owned_fd()
    }
}

#[cfg(not(loom))]
adopt_fd!(TcpListener, net::TcpListener);
#[cfg(not(loom))]
adopt_fd!(TcpStream, net::TcpStream);
