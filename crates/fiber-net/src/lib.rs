//! `std::net` for fibers: TCP and UDP sockets whose blocking calls park the
//! calling fiber instead of its worker thread (and block a plain thread as
//! std does). Porting a `std::net` program is an import change.
//!
//! Sockets are non-blocking underneath and registered once, edge-triggered,
//! with a process-wide I/O driver: a poller thread (started on first use)
//! that waits in `epoll_wait` and wakes parked fibers through fiber-core's
//! `fiber_wake`. The crate depends on fiber-core's contract only, so it
//! works on any scheduler that implements it. The protocol is in
//! `spec/net.md`.
//!
//! Every blocking call is a cancellation point: when the fiber's task or
//! job is cancelled, the call returns an `io::Error` of kind
//! [`Other`](std::io::ErrorKind::Other) whose inner error downcasts to
//! [`fiber_core::Cancelled`] (not `Interrupted`, which `read_exact` and
//! `write_all` would retry forever).
//!
//! File I/O has no readiness on Linux (a regular file is always "ready"
//! and a read from a slow disk blocks in the kernel), so it stays on the
//! scheduler's blocking pool (`fiber::blocking`).
//!
//! A process that `fork`s without `exec` after the driver started cannot
//! use these sockets in the child: the child shares the parent's epoll
//! instance and has no poller thread, so its waits would never wake (as
//! with tokio and Go, create sockets after the fork, or `exec`).
//!
//! # Examples
//!
//! ```
//! # mod fiber { pub use fiber_core::spawn; pub(crate) use fiber_net as net; pub use fiber_sched::Runtime; }
//! use fiber::net::{TcpListener, TcpStream};
//! use std::io::{Read, Write};
//!
//! let rt = fiber::Runtime::builder().workers(2).build().unwrap();
//! let echoed = rt.block_on(|| {
//!     let listener = TcpListener::bind("127.0.0.1:0").unwrap();
//!     let addr = listener.local_addr().unwrap();
//!     let server = fiber::spawn(move || {
//!         let (mut conn, _) = listener.accept().unwrap();
//!         let mut buf = [0; 5];
//!         conn.read_exact(&mut buf).unwrap();
//!         conn.write_all(&buf).unwrap();
//!     });
//!     let mut client = TcpStream::connect(addr).unwrap();
//!     client.write_all(b"hello").unwrap();
//!     let mut back = String::new();
//!     client.read_to_string(&mut back).unwrap();
//!     server.join().unwrap();
//!     back
//! });
//! assert_eq!(echoed, "hello");
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![cfg_attr(loom, allow(dead_code, unused_imports))]

mod sync;

/// `std`'s descriptor conversions for a socket type `$t` whose std twin is
/// `$std`: `From<OwnedFd>`, `FromRawFd` and `IntoRawFd`, so that porting
/// code that adopts or hands out raw descriptors is an import change.
#[cfg(not(loom))]
macro_rules! adopt_fd {
    ($t:ident, $std:ty) => {
        /// Adopt a socket descriptor, as `std`'s `From<OwnedFd>` does: the
        /// socket is made non-blocking and registered with the I/O driver
        /// (its read and write timeouts, if any, are kept).
        ///
        /// # Panics
        ///
        /// If the I/O driver cannot register it (the driver could not
        /// start, or the kernel refused: `epoll_ctl`'s `ENOSPC` past
        /// `max_user_watches`); `from_std` returns that error instead.
        impl From<std::os::fd::OwnedFd> for $t {
            fn from(fd: std::os::fd::OwnedFd) -> $t {
                match <$t>::from_std(<$std>::from(fd)) {
                    Ok(socket) => socket,
                    Err(e) => panic!(concat!("fiber::net::", stringify!($t), "::from(OwnedFd): {}"), e),
                }
            }
        }

        impl std::os::fd::FromRawFd for $t {
            /// As [`From<OwnedFd>`](#impl-From<OwnedFd>-for-Self).
            ///
            /// # Safety
            ///
            /// `fd` is an open socket of this type that the caller owns and
            /// gives up (`std`'s contract).
            unsafe fn from_raw_fd(fd: std::os::fd::RawFd) -> $t {
                // SAFETY: the caller's contract.
                <$t>::from(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
            }
        }

        impl std::os::fd::IntoRawFd for $t {
            /// The socket's descriptor, deregistered from the I/O driver;
            /// the caller owns it (and closes it).
            fn into_raw_fd(self) -> std::os::fd::RawFd {
                std::os::fd::IntoRawFd::into_raw_fd(std::os::fd::OwnedFd::from(self))
            }
        }
    };
}

/// `Read` and `Write` for a stream type and for a shared reference to it
/// (so a reader fiber and a writer fiber can use one connection): each call
/// parks on the socket's readiness through its `io` field. With
/// `short_read_drains = true` (TCP) a short read counts as having emptied
/// the receive queue (spec/net.md section 4a), and an empty read whose
/// timeout expires returns 0; not for Unix streams, whose reads also stop
/// short at a message carrying file descriptors or other credentials, with
/// more queued behind it, and whose empty read times out with `WouldBlock`
/// as std's does.
#[cfg(not(loom))]
macro_rules! stream_io {
    ($stream:ty, short_read_drains = $drains:expr) => {
        impl std::io::Read for &$stream {
            #[track_caller]
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                let len = buf.len();
                let read = if $drains {
                    self.io
                        .read_stream::<$crate::readiness::op::Read>(len, |mut s| std::io::Read::read(&mut s, buf))
                } else {
                    self.io
                        .read::<$crate::readiness::op::Read, _>(|mut s| std::io::Read::read(&mut s, buf))
                };
                // An empty read whose timeout expires: 0 on TCP, as a
                // blocking `recv` of 0 bytes returns there; a unix stream's
                // blocking read says `EAGAIN` (`WouldBlock`) instead.
                if len == 0 && $drains {
                    return self.io.empty_read(read);
                }
                read
            }

            #[track_caller]
            fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
                let read = self
                    .io
                    .read::<$crate::readiness::op::Read, _>(|mut s| std::io::Read::read_vectored(&mut s, bufs));
                if matches!(read, Ok(0)) && bufs.iter().any(|b| !b.is_empty()) {
                    // End of file, at once and on every later call: a loop
                    // that reads on is polling (as `read` at end of file).
                    fiber_core::poll_missed();
                }
                read
            }

            // std's provided loops, here so that the fiber dump names the
            // caller's line rather than one inside std (`#[track_caller]`
            // through each `read`), with std's errors and retries.
            #[track_caller]
            fn read_exact(&mut self, mut buf: &mut [u8]) -> std::io::Result<()> {
                while !buf.is_empty() {
                    match std::io::Read::read(self, buf) {
                        Ok(0) => {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "failed to fill whole buffer",
                            ))
                        }
                        Ok(n) => buf = &mut std::mem::take(&mut buf)[n..],
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }

            #[track_caller]
            fn read_to_end(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
                let start = buf.len();
                loop {
                    if buf.capacity() - buf.len() < 32 {
                        buf.reserve(8 * 1024);
                    }
                    let len = buf.len();
                    // At most 64 KiB zeroed per read, however large the
                    // spare capacity.
                    let room = (buf.capacity() - len).min(64 * 1024);
                    buf.resize(len + room, 0);
                    match std::io::Read::read(self, &mut buf[len..]) {
                        Ok(0) => {
                            buf.truncate(len);
                            return Ok(len - start);
                        }
                        Ok(n) => buf.truncate(len + n),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => buf.truncate(len),
                        Err(e) => {
                            buf.truncate(len);
                            return Err(e);
                        }
                    }
                }
            }

            #[track_caller]
            fn read_to_string(&mut self, buf: &mut String) -> std::io::Result<usize> {
                // As std: the bytes read are kept only if they are UTF-8
                // (with an I/O error too, which is then returned).
                let mut bytes = Vec::new();
                let result = std::io::Read::read_to_end(self, &mut bytes);
                match std::str::from_utf8(&bytes) {
                    Ok(text) => {
                        buf.push_str(text);
                        result
                    }
                    Err(_) => result.and_then(|_| {
                        Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "stream did not contain valid UTF-8",
                        ))
                    }),
                }
            }
        }

        impl std::io::Write for &$stream {
            #[track_caller]
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.io
                    .write::<$crate::readiness::op::Write, _>(|mut s| std::io::Write::write(&mut s, buf))
            }

            #[track_caller]
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                self.io
                    .write::<$crate::readiness::op::Write, _>(|mut s| std::io::Write::write_vectored(&mut s, bufs))
            }

            // As `read_exact` above.
            #[track_caller]
            fn write_all(&mut self, mut buf: &[u8]) -> std::io::Result<()> {
                while !buf.is_empty() {
                    match std::io::Write::write(self, buf) {
                        Ok(0) => {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::WriteZero,
                                "failed to write whole buffer",
                            ))
                        }
                        Ok(n) => buf = &buf[n..],
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }

            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }

        impl std::io::Read for $stream {
            #[track_caller]
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                std::io::Read::read(&mut &*self, buf)
            }

            #[track_caller]
            fn read_vectored(&mut self, bufs: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
                std::io::Read::read_vectored(&mut &*self, bufs)
            }

            #[track_caller]
            fn read_exact(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
                std::io::Read::read_exact(&mut &*self, buf)
            }

            #[track_caller]
            fn read_to_end(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
                std::io::Read::read_to_end(&mut &*self, buf)
            }

            #[track_caller]
            fn read_to_string(&mut self, buf: &mut String) -> std::io::Result<usize> {
                std::io::Read::read_to_string(&mut &*self, buf)
            }
        }

        impl std::io::Write for $stream {
            #[track_caller]
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                std::io::Write::write(&mut &*self, buf)
            }

            #[track_caller]
            fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
                std::io::Write::write_vectored(&mut &*self, bufs)
            }

            #[track_caller]
            fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
                std::io::Write::write_all(&mut &*self, buf)
            }

            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
    };
}
#[cfg(not(loom))]
pub(crate) use stream_io;

mod readiness;
mod rest;

#[cfg(not(loom))]
mod driver;
#[cfg(not(loom))]
mod source;
#[cfg(not(loom))]
mod tcp;
#[cfg(not(loom))]
mod udp;
#[cfg(not(loom))]
pub mod unix;

#[cfg(not(loom))]
pub use driver::{poll_stats, PollStats};
pub use readiness::io_waiters;
/// std's address types and `Shutdown`, which the sockets here take and
/// return: re-exported so that a port from `std::net` is an import change.
pub use std::net::{
    AddrParseError, IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs,
};
#[cfg(not(loom))]
pub use tcp::{Incoming, TcpListener, TcpStream};
#[cfg(not(loom))]
pub use udp::UdpSocket;
/// The Unix-domain sockets at the root too (as `std::os::unix::net` has
/// them beside each other), so `fiber::net::UnixStream` names the same
/// type as `fiber::net::unix::UnixStream`. Their `Incoming` and
/// `SocketAddr` stay in [`unix`], where the TCP ones do not clash.
#[cfg(not(loom))]
pub use unix::{UnixDatagram, UnixListener, UnixStream};

#[cfg(test)]
mod tests;
