//! A registered mio source plus the per-handle settings every socket type
//! shares: read and write timeouts and std's non-blocking mode.

use crate::driver::Registration;
use crate::readiness::{op, OnTimeout, READ, WRITE};
use mio::event::Source;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// "No timeout" in a timeout cell.
const NO_TIMEOUT: u64 = 0;

/// A socket's addresses, as the fiber dump names what a fiber waits on;
/// `None` while they are not known yet (a connect in progress).
pub(crate) trait Describe {
    fn describe(&self) -> Option<String>;
}

fn stream_label(local: io::Result<std::net::SocketAddr>, peer: io::Result<std::net::SocketAddr>) -> Option<String> {
    Some(format!("{} -> {}", local.ok()?, peer.ok()?))
}

impl Describe for mio::net::TcpListener {
    fn describe(&self) -> Option<String> {
        Some(self.local_addr().ok()?.to_string())
    }
}

impl Describe for mio::net::TcpStream {
    fn describe(&self) -> Option<String> {
        stream_label(self.local_addr(), self.peer_addr())
    }
}

impl Describe for mio::net::UdpSocket {
    fn describe(&self) -> Option<String> {
        let local = self.local_addr().ok()?;
        Some(match self.peer_addr() {
            Ok(peer) => format!("{local} -> {peer}"),
            Err(_) => local.to_string(),
        })
    }
}

fn unix_path(addr: io::Result<std::os::unix::net::SocketAddr>) -> String {
    match addr
        .ok()
        .as_ref()
        .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
    {
        Some(path) => path,
        None => "(unnamed)".to_string(),
    }
}

impl Describe for mio::net::UnixListener {
    fn describe(&self) -> Option<String> {
        Some(unix_path(self.local_addr()))
    }
}

impl Describe for mio::net::UnixStream {
    fn describe(&self) -> Option<String> {
        self.peer_addr().ok()?;
        Some(format!(
            "{} -> {}",
            unix_path(self.local_addr()),
            unix_path(self.peer_addr())
        ))
    }
}

impl Describe for mio::net::UnixDatagram {
    fn describe(&self) -> Option<String> {
        Some(unix_path(self.local_addr()))
    }
}

/// A socket registered with the driver.
pub(crate) struct Io<S: Source> {
    /// `None` only after `into_inner`.
    source: Option<S>,
    registration: Registration,
    /// Shared by the handles `try_clone` makes (see [`Settings`]).
    settings: Arc<Settings>,
}

// Like std's sockets: the registration's state (readiness sequences, the
// waiter lists) is changed only under its locks by runtime code, never
// while user code runs, so it is consistent after any panic and a socket
// may cross `catch_unwind`.
impl<S: Source> std::panic::UnwindSafe for Io<S> {}
impl<S: Source> std::panic::RefUnwindSafe for Io<S> {}

/// What std keeps on the socket itself (`SO_RCVTIMEO`, `SO_SNDTIMEO`,
/// `O_NONBLOCK`), so that, as std documents for `try_clone`, an option set
/// on one handle is seen by the others.
struct Settings {
    /// Nanoseconds (whole seconds with `IN_SECONDS` set, past 292 years),
    /// [`NO_TIMEOUT`] for none. Settings only (Relaxed): no
    /// other data is published through them.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    nonblocking: AtomicBool,
    /// The registrations of every handle sharing the socket (empty until
    /// the first `try_clone`): a unix socket's write shutdown through one
    /// handle must wake the writers parked on the others (the kernel
    /// reports no readiness for it). Taken only by `try_clone` and
    /// `shutdown`.
    handles: std::sync::Mutex<Vec<std::sync::Weak<crate::readiness::Readiness>>>,
}

impl<S: Source + Describe> Io<S> {
    pub(crate) fn new(source: S) -> io::Result<Io<S>> {
        Io::try_new(source).map_err(|(e, _)| e)
    }

    /// As [`Io::new`], giving the source back if its registration fails
    /// (an accepted connection must not be lost to a failed `epoll_ctl`).
    pub(crate) fn try_new(mut source: S) -> Result<Io<S>, (io::Error, S)> {
        let registration = match Registration::new(&mut source) {
            Ok(registration) => registration,
            Err(e) => return Err((e, source)),
        };
        Ok(Io {
            source: Some(source),
            registration,
            settings: Arc::new(Settings {
                read_timeout: AtomicU64::new(NO_TIMEOUT),
                write_timeout: AtomicU64::new(NO_TIMEOUT),
                nonblocking: AtomicBool::new(false),
                handles: std::sync::Mutex::new(Vec::new()),
            }),
        })
    }

    /// For `try_clone`: this handle (a duplicate of `original`'s fd) shares
    /// `original`'s timeouts and non-blocking mode from now on.
    pub(crate) fn share_settings<T: Source>(&mut self, original: &Io<T>) {
        self.settings = original.settings.clone();
        let mut handles = self.settings.handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.retain(|h| h.strong_count() > 0);
        if handles.is_empty() {
            handles.push(Arc::downgrade(&original.registration.readiness));
        }
        handles.push(Arc::downgrade(&self.registration.readiness));
    }

    #[inline]
    pub(crate) fn get(&self) -> &S {
        match &self.source {
            Some(source) => source,
            None => unreachable!("fiber-net: a socket was used after into_inner"),
        }
    }

    /// Is another handle (made by `try_clone`) sharing this socket? The
    /// socket's non-blocking mode belongs to it, not to one handle.
    pub(crate) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.settings) > 1
    }

    /// Should the descriptor handed back (`into_std`, `From<socket> for
    /// OwnedFd`) be made blocking? Yes, as std's sockets are, unless a
    /// `try_clone` of this handle still shares the socket (blocking mode
    /// belongs to the socket, and the other handles park on it) or the
    /// user set it non-blocking (`set_nonblocking(true)`: the mode stays,
    /// as it would on a std socket).
    pub(crate) fn hand_back_blocking(&self) -> bool {
        !self.is_shared() && !self.is_nonblocking()
    }

    /// Deregister and hand back the descriptor (`From<socket> for
    /// OwnedFd`), in blocking mode as std's sockets are, unless
    /// [`hand_back_blocking`](Self::hand_back_blocking) says otherwise.
    pub(crate) fn into_owned_fd(self) -> std::os::fd::OwnedFd
    where
        S: Into<std::os::fd::OwnedFd>,
    {
        use std::os::fd::AsRawFd;
        let blocking = self.hand_back_blocking();
        let fd: std::os::fd::OwnedFd = self.into_inner().into();
        if blocking {
            // SAFETY: F_GETFL / F_SETFL on a descriptor we own (alive for
            // both calls); they read and write only its status flags. On
            // failure the descriptor stays non-blocking, as it was.
            unsafe {
                let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                    libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
                }
            }
        }
        fd
    }

    /// Deregister and hand back the source.
    pub(crate) fn into_inner(mut self) -> S {
        let mut source = self.source.take().expect("into_inner runs once");
        self.registration.deregister(&mut source);
        source
    }

    /// Run `op` for reading until it does not block, honouring the read
    /// timeout (expiry: `WouldBlock`, as std on Linux).
    #[inline]
    #[track_caller]
    pub(crate) fn read<K: op::Name, R>(&self, op: impl FnMut(&S) -> io::Result<R>) -> io::Result<R> {
        let deadline = deadline(&self.settings.read_timeout);
        self.poll::<K, R>(READ, deadline, OnTimeout::WouldBlock, op)
    }

    /// A stream read into a buffer of `len` bytes (`Readiness::poll_stream_read`:
    /// after a short read, the next one parks without a `WouldBlock` call).
    #[inline]
    #[track_caller]
    pub(crate) fn read_stream<K: op::Name>(
        &self,
        len: usize,
        mut op: impl FnMut(&S) -> io::Result<usize>,
    ) -> io::Result<usize> {
        let deadline = deadline(&self.settings.read_timeout);
        let source = self.get();
        let nonblocking = self.settings.nonblocking.load(Ordering::Relaxed);
        self.registration
            .readiness
            .poll_stream_read::<K>(len, deadline, nonblocking, &|| source.describe(), || op(source))
    }

    /// The result of a read into an empty buffer: a blocking std socket's
    /// `recv` of 0 bytes returns 0 when its read timeout expires, where the
    /// parked read reports the expiry as `WouldBlock`. (A socket set
    /// non-blocking keeps std's `WouldBlock`.)
    pub(crate) fn empty_read(&self, read: io::Result<usize>) -> io::Result<usize> {
        match read {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !self.settings.nonblocking.load(Ordering::Relaxed) => {
                Ok(0)
            }
            other => other,
        }
    }

    /// `shutdown(Read)` ends reads without new data: forget a short read.
    pub(crate) fn forget_drained(&self) {
        self.registration.readiness.forget_drained();
    }

    /// After this socket's own write shutdown: wake the parked writers,
    /// whose retry now fails with `BrokenPipe` (`EPIPE`). A unix socket's
    /// poll reports nothing for a send shutdown (TCP's reports it
    /// writable), so without this a write parked on a full unix socket
    /// stayed parked, where std's blocked write fails at once.
    pub(crate) fn wake_writers(&self) {
        self.registration.readiness.set_ready(false, true);
        // The same for the handles `try_clone` made (and the one it was
        // made from): they share the socket, and their writes fail too.
        let others: Vec<_> = {
            let handles = self.settings.handles.lock().unwrap_or_else(|e| e.into_inner());
            handles.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for readiness in others {
            if !Arc::ptr_eq(&readiness, &self.registration.readiness) {
                readiness.set_ready(false, true);
            }
        }
    }

    /// Is the socket shut down for reading, with nothing queued (the
    /// caller's call just returned `WouldBlock`)? A blocking receive of a
    /// datagram socket (or an accept on a listening unix socket) then
    /// returns at once; the non-blocking one keeps returning `EAGAIN`, and
    /// no further readiness event comes, so without this check a parked
    /// call would wait for ever. Asked of the kernel (`POLLRDHUP`), since a
    /// clone or a raw `shutdown(2)` may have done it, and only once an
    /// event reported the read side closed (no system call on the usual
    /// `WouldBlock`). In non-blocking mode the `WouldBlock` stands, as
    /// with std.
    pub(crate) fn read_shut_down(&self) -> bool
    where
        S: std::os::fd::AsRawFd,
    {
        if self.is_nonblocking() || !self.registration.readiness.saw_read_closed() {
            return false;
        }
        let mut pollfd = libc::pollfd {
            fd: self.get().as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid `pollfd` for a descriptor this handle owns;
        // a zero timeout never blocks.
        let n = unsafe { libc::poll(&mut pollfd, 1, 0) };
        n == 1 && pollfd.revents & libc::POLLRDHUP != 0
    }

    /// As [`read`](Self::read) for writing.
    #[inline]
    #[track_caller]
    pub(crate) fn write<K: op::Name, R>(&self, op: impl FnMut(&S) -> io::Result<R>) -> io::Result<R> {
        let deadline = deadline(&self.settings.write_timeout);
        self.poll::<K, R>(WRITE, deadline, OnTimeout::WouldBlock, op)
    }

    /// Run `op` until it does not block, for `dir`, with an explicit deadline.
    #[track_caller]
    pub(crate) fn poll<K: op::Name, R>(
        &self,
        dir: usize,
        deadline: Option<Instant>,
        on_timeout: OnTimeout,
        mut op: impl FnMut(&S) -> io::Result<R>,
    ) -> io::Result<R> {
        let source = self.get();
        let nonblocking = self.settings.nonblocking.load(Ordering::Relaxed);
        self.registration.readiness.poll_io_described::<K, R>(
            dir,
            deadline,
            on_timeout,
            nonblocking,
            &|| source.describe(),
            || op(source),
        )
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>
    where
        S: std::os::fd::AsRawFd,
    {
        let kernel = kernel_timeout(self.get().as_raw_fd(), libc::SO_RCVTIMEO, timeout)?;
        set_timeout(&self.settings.read_timeout, kernel)
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>
    where
        S: std::os::fd::AsRawFd,
    {
        let kernel = kernel_timeout(self.get().as_raw_fd(), libc::SO_SNDTIMEO, timeout)?;
        set_timeout(&self.settings.write_timeout, kernel)
    }

    pub(crate) fn read_timeout(&self) -> Option<Duration> {
        get_timeout(&self.settings.read_timeout)
    }

    pub(crate) fn write_timeout(&self) -> Option<Duration> {
        get_timeout(&self.settings.write_timeout)
    }

    /// Take the socket's own `SO_RCVTIMEO` / `SO_SNDTIMEO` as this
    /// handle's timeouts (an adopted listener: std's blocking `accept`
    /// obeys them, and Linux copies them to the sockets it accepts).
    pub(crate) fn adopt_kernel_timeouts(&self) -> io::Result<()>
    where
        S: std::os::fd::AsRawFd,
    {
        let fd = self.get().as_raw_fd();
        set_timeout(&self.settings.read_timeout, kernel_timeout_of(fd, libc::SO_RCVTIMEO)?)?;
        set_timeout(&self.settings.write_timeout, kernel_timeout_of(fd, libc::SO_SNDTIMEO)?)
    }

    /// A socket `listener` accepted starts with its timeouts, as Linux
    /// copies `SO_RCVTIMEO` / `SO_SNDTIMEO` to it (no system call: the
    /// kernel already did).
    #[inline]
    pub(crate) fn inherit_timeouts<T: Source>(&self, listener: &Io<T>) {
        // Relaxed: settings only (see `Settings`).
        let read = listener.settings.read_timeout.load(Ordering::Relaxed);
        let write = listener.settings.write_timeout.load(Ordering::Relaxed);
        if read != NO_TIMEOUT || write != NO_TIMEOUT {
            self.settings.read_timeout.store(read, Ordering::Relaxed);
            self.settings.write_timeout.store(write, Ordering::Relaxed);
        }
    }

    /// Does `set_nonblocking(true)` hold (calls return `WouldBlock`)?
    pub(crate) fn is_nonblocking(&self) -> bool {
        self.settings.nonblocking.load(Ordering::Relaxed)
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) {
        self.settings.nonblocking.store(nonblocking, Ordering::Relaxed);
    }
}

impl<S: Source> Drop for Io<S> {
    fn drop(&mut self) {
        if let Some(source) = self.source.as_mut() {
            self.registration.deregister(source);
        }
    }
}

/// A std socket's timeouts live in the kernel (`SO_RCVTIMEO` /
/// `SO_SNDTIMEO`), which rounds them up to its clock tick, and std's
/// getters read them back (1.5 ms reads back as 4 ms with a 250 Hz tick).
/// Set the kernel's option too (a non-blocking socket ignores it for its
/// calls) and return what the kernel keeps: the handle's getters then
/// report what std's would, its waits last that long, and a socket handed
/// to std (`into_std`, `OwnedFd`) keeps its timeouts. `Some(0)` is
/// `InvalidInput`, as in std.
fn kernel_timeout(
    fd: std::os::fd::RawFd,
    option: libc::c_int,
    timeout: Option<Duration>,
) -> io::Result<Option<Duration>> {
    let tv = match timeout {
        None => libc::timeval { tv_sec: 0, tv_usec: 0 },
        Some(d) if d.is_zero() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ))
        }
        Some(d) => libc::timeval {
            tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
            // Under a microsecond: one (zero would mean "no timeout").
            tv_usec: (d.subsec_micros() as libc::suseconds_t).max(libc::suseconds_t::from(d.as_secs() == 0)),
        },
    };
    let size = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: `fd` is the open socket of the caller's handle; `tv` is a
    // valid `timeval` of `size` bytes, read only during the call.
    let set = unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, option, (&raw const tv).cast(), size) };
    if set == -1 {
        return Err(io::Error::last_os_error());
    }
    let mut back = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let mut len = size;
    // SAFETY: as above; `back` has room for `len` bytes, written only
    // during the call.
    let got = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, option, (&raw mut back).cast(), &mut len) };
    if got == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok((back.tv_sec != 0 || back.tv_usec != 0).then(|| Duration::new(back.tv_sec as u64, back.tv_usec as u32 * 1000)))
}

/// The socket's `SO_RCVTIMEO` or `SO_SNDTIMEO` (`None`: no timeout).
fn kernel_timeout_of(fd: std::os::fd::RawFd, option: libc::c_int) -> io::Result<Option<Duration>> {
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: `fd` is the open socket of the caller's handle; `tv` has
    // room for `len` bytes, written only during the call.
    let got = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, option, (&raw mut tv).cast(), &mut len) };
    if got == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok((tv.tv_sec != 0 || tv.tv_usec != 0).then(|| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000)))
}

fn set_timeout(cell: &AtomicU64, timeout: Option<Duration>) -> io::Result<()> {
    let nanos = match timeout {
        None => NO_TIMEOUT,
        Some(d) if d.is_zero() => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ))
        }
        Some(d) => match u64::try_from(d.as_nanos()) {
            Ok(nanos) if nanos < IN_SECONDS => nanos.max(1),
            // Over 292 years: whole seconds, flagged.
            _ => IN_SECONDS | d.as_secs(),
        },
    };
    cell.store(nanos, Ordering::Relaxed);
    Ok(())
}

/// A timeout value in whole seconds (`set_timeout`) rather than nanoseconds.
const IN_SECONDS: u64 = 1 << 63;

fn timeout_of(stored: u64) -> Option<Duration> {
    match stored {
        NO_TIMEOUT => None,
        n if n & IN_SECONDS != 0 => Some(Duration::from_secs(n & !IN_SECONDS)),
        n => Some(Duration::from_nanos(n)),
    }
}

fn get_timeout(cell: &AtomicU64) -> Option<Duration> {
    timeout_of(cell.load(Ordering::Relaxed))
}

#[inline]
fn deadline(cell: &AtomicU64) -> Option<Instant> {
    // A timeout too long for `Instant` is no timeout.
    timeout_of(cell.load(Ordering::Relaxed)).and_then(|d| Instant::now().checked_add(d))
}

/// A listener's accepted connection whose registration failed (`ENOSPC`
/// past `fs.epoll.max_user_watches`, `ENOMEM`): the kernel has already
/// taken it off the accept queue, so dropping it would close a connection
/// the caller never saw. The accept reports the error and keeps the
/// connection here; the next accept tries it again first.
pub(crate) struct Pending<T>(std::sync::Mutex<Option<T>>);

impl<T> Pending<T> {
    pub(crate) const fn new() -> Pending<T> {
        Pending(std::sync::Mutex::new(None))
    }

    pub(crate) fn take(&self) -> Option<T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub(crate) fn put(&self, value: T) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
    }
}
