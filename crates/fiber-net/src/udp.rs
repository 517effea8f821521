//! UDP: [`UdpSocket`], with `std::net`'s API.

use crate::readiness::op;
use crate::source::Io;
use crate::tcp::each_addr;
use std::fmt;
use std::io;
use std::net::{self, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::Duration;

/// A UDP socket: `std::net::UdpSocket` whose receives (and full-buffer
/// sends) park the calling fiber (or block the calling thread). Every
/// blocking call is a cancellation point (see [`crate::TcpStream`]).
///
/// # Examples
///
/// ```
/// # mod fiber { pub(crate) use fiber_net as net; }
/// use fiber::net::UdpSocket;
///
/// let a = UdpSocket::bind("127.0.0.1:0").unwrap();
/// let b = UdpSocket::bind("127.0.0.1:0").unwrap();
/// a.send_to(b"hi", b.local_addr().unwrap()).unwrap();
/// let mut buf = [0; 8];
/// let (n, from) = b.recv_from(&mut buf).unwrap();
/// assert_eq!((&buf[..n], from), (&b"hi"[..], a.local_addr().unwrap()));
/// ```
pub struct UdpSocket {
    io: Io<mio::net::UdpSocket>,
}

impl UdpSocket {
    /// A receive that would block on a socket shut down for reading: std's
    /// blocking `recv` returns 0 there (the non-blocking call keeps saying
    /// `EAGAIN`, and no further event would wake a parked one).
    fn or_shut_down(&self, received: io::Result<usize>) -> io::Result<usize> {
        match received {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.io.read_shut_down() => {
                // Returned at once, and by every later call: a loop that
                // receives on is polling (as an error at once is).
                fiber_core::poll_missed();
                Ok(0)
            }
            other => other,
        }
    }

    /// As [`or_shut_down`](Self::or_shut_down) for the calls that return
    /// the sender: std's gets no address and fails with `InvalidInput`.
    fn or_shut_down_from(&self, received: io::Result<(usize, SocketAddr)>) -> io::Result<(usize, SocketAddr)> {
        match received {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.io.read_shut_down() => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket is shut down for reading: no datagram and no address",
            )),
            other => other,
        }
    }

    /// Bind to `addr` (each resolved address in turn).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<UdpSocket> {
        let socket = each_addr(addr, mio::net::UdpSocket::bind)?;
        Ok(UdpSocket { io: Io::new(socket)? })
    }

    /// Send `buf` to `addr` (its first resolved address).
    #[track_caller]
    pub fn send_to<A: ToSocketAddrs>(&self, buf: &[u8], addr: A) -> io::Result<usize> {
        let target = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no addresses to send data to"))?;
        self.io.write::<op::Send, _>(|s| s.send_to(buf, target))
    }

    /// Receive one datagram, parking until one arrives. On a socket shut
    /// down for reading (`shutdown(2)` on its descriptor) with nothing
    /// queued it fails at once with `InvalidInput`, as std's blocking
    /// socket does (its receive gets no datagram and no address).
    #[track_caller]
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.io
            .read::<op::Recv, _>(|s| self.or_shut_down_from(s.recv_from(buf)))
    }

    /// Receive one datagram without removing it from the queue.
    #[track_caller]
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.io
            .read::<op::Recv, _>(|s| self.or_shut_down_from(s.peek_from(buf)))
    }

    /// Set the default peer (each resolved address in turn); `send` and
    /// `recv` then use it and datagrams from other peers are dropped.
    #[track_caller]
    pub fn connect<A: ToSocketAddrs>(&self, addr: A) -> io::Result<()> {
        each_addr(addr, |addr| self.io.get().connect(addr))
    }

    /// Send to the connected peer.
    #[track_caller]
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.io.write::<op::Send, _>(|s| s.send(buf))
    }

    /// Receive from the connected peer. On a socket shut down for reading
    /// with nothing queued it returns `Ok(0)` at once, as std's blocking
    /// socket does.
    #[track_caller]
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read::<op::Recv, _>(|s| self.or_shut_down(s.recv(buf)))
    }

    /// Receive from the connected peer without removing the datagram.
    #[track_caller]
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.io.read::<op::Recv, _>(|s| self.or_shut_down(s.peek(buf)))
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().local_addr()
    }

    /// The connected peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.io.get().peer_addr()
    }

    /// Set the receive timeout; an expired receive is an error of kind
    /// `WouldBlock` (`EAGAIN`, as std on Linux). `Some(0)` is `InvalidInput`.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.io.set_read_timeout(timeout)
    }

    /// Set the send timeout (as [`set_read_timeout`](Self::set_read_timeout)).
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

    /// Set `SO_BROADCAST`.
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        self.io.get().set_broadcast(on)
    }

    /// `SO_BROADCAST`.
    pub fn broadcast(&self) -> io::Result<bool> {
        self.io.get().broadcast()
    }

    /// Set `IP_MULTICAST_LOOP`.
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        self.io.get().set_multicast_loop_v4(on)
    }

    /// `IP_MULTICAST_LOOP`.
    pub fn multicast_loop_v4(&self) -> io::Result<bool> {
        self.io.get().multicast_loop_v4()
    }

    /// Set `IP_MULTICAST_TTL`.
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        self.io.get().set_multicast_ttl_v4(ttl)
    }

    /// `IP_MULTICAST_TTL`.
    pub fn multicast_ttl_v4(&self) -> io::Result<u32> {
        self.io.get().multicast_ttl_v4()
    }

    /// Set `IPV6_MULTICAST_LOOP`.
    pub fn set_multicast_loop_v6(&self, on: bool) -> io::Result<()> {
        self.io.get().set_multicast_loop_v6(on)
    }

    /// `IPV6_MULTICAST_LOOP`.
    pub fn multicast_loop_v6(&self) -> io::Result<bool> {
        self.io.get().multicast_loop_v6()
    }

    /// Join the IPv4 multicast group `multiaddr` on `interface`
    /// (`IP_ADD_MEMBERSHIP`).
    pub fn join_multicast_v4(&self, multiaddr: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.io.get().join_multicast_v4(multiaddr, interface)
    }

    /// Join the IPv6 multicast group `multiaddr` on interface index
    /// `interface` (0: any; `IPV6_ADD_MEMBERSHIP`).
    pub fn join_multicast_v6(&self, multiaddr: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.io.get().join_multicast_v6(multiaddr, interface)
    }

    /// Leave an IPv4 multicast group (`IP_DROP_MEMBERSHIP`).
    pub fn leave_multicast_v4(&self, multiaddr: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.io.get().leave_multicast_v4(multiaddr, interface)
    }

    /// Leave an IPv6 multicast group (`IPV6_DROP_MEMBERSHIP`).
    pub fn leave_multicast_v6(&self, multiaddr: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.io.get().leave_multicast_v6(multiaddr, interface)
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

    /// With `true`, calls return `WouldBlock` instead of parking.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.io.set_nonblocking(nonblocking);
        Ok(())
    }

    /// A second handle on the same socket (a duplicated fd with its own
    /// registration). As in std, options set on one handle (timeouts,
    /// non-blocking mode, socket options) apply to both.
    #[track_caller]
    pub fn try_clone(&self) -> io::Result<UdpSocket> {
        let fd = self.io.get().as_fd().try_clone_to_owned()?;
        let mut clone = UdpSocket::from_std(net::UdpSocket::from(fd))?;
        clone.io.share_settings(&self.io);
        Ok(clone)
    }

    /// Adopt a std socket (switched to non-blocking mode internally).
    /// Non-blocking mode belongs to the socket, not to one handle: a std
    /// handle cloned from it before (`try_clone`) is non-blocking from now
    /// on too, and its calls return `WouldBlock` instead of waiting.
    pub fn from_std(socket: net::UdpSocket) -> io::Result<UdpSocket> {
        // Timeouts set on the std socket (`SO_RCVTIMEO`/`SO_SNDTIMEO`) stay
        // in force: a non-blocking socket ignores them, so they become
        // this handle's.
        let (read, write) = (socket.read_timeout()?, socket.write_timeout()?);
        socket.set_nonblocking(true)?;
        let io = Io::new(mio::net::UdpSocket::from_std(socket))?;
        io.set_read_timeout(read)?;
        io.set_write_timeout(write)?;
        Ok(UdpSocket { io })
    }

    /// Back to a std socket, in blocking mode.
    ///
    /// Unless a handle made from this one with `try_clone` is still open:
    /// blocking mode belongs to the socket, which the handles share, and
    /// it would make their calls block the thread instead of parking the
    /// fiber, so the socket stays non-blocking (call `set_nonblocking(false)`
    /// on it once they are gone).
    pub fn into_std(self) -> io::Result<net::UdpSocket> {
        let blocking = self.io.hand_back_blocking();
        let socket = net::UdpSocket::from(self.io.into_inner());
        if blocking {
            socket.set_nonblocking(false)?;
        }
        Ok(socket)
    }
}

impl fmt::Debug for UdpSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // As std prints it: the address only when known.
        let mut d = f.debug_struct("UdpSocket");
        if let Ok(addr) = self.local_addr() {
            d.field("addr", &addr);
        }
        d.field("fd", &self.as_raw_fd()).finish()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.io.get().as_raw_fd()
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.get().as_fd()
    }
}

impl TryFrom<net::UdpSocket> for UdpSocket {
    type Error = io::Error;
    fn try_from(socket: net::UdpSocket) -> io::Result<UdpSocket> {
        UdpSocket::from_std(socket)
    }
}

impl From<UdpSocket> for OwnedFd {
    fn from(socket: UdpSocket) -> OwnedFd {
        socket.io.into_owned_fd()
    }
}

#[cfg(not(loom))]
adopt_fd!(UdpSocket, net::UdpSocket);
