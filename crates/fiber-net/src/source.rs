//! A registered mio source plus the per-handle settings every socket type
//! shares: read and write timeouts and std's non-blocking mode.

use crate::driver::Registration;
use crate::readiness::{OnTimeout, READ, WRITE};
use mio::event::Source;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// "No timeout" in a timeout cell.
const NO_TIMEOUT: u64 = 0;

/// A socket registered with the driver.
pub(crate) struct Io<S: Source> {
    /// `None` only after `into_inner`.
    source: Option<S>,
    registration: Registration,
    /// Nanoseconds, [`NO_TIMEOUT`] for none. Settings only (Relaxed): no
    /// other data is published through them.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    nonblocking: AtomicBool,
}

impl<S: Source> Io<S> {
    pub(crate) fn new(mut source: S) -> io::Result<Io<S>> {
        let registration = Registration::new(&mut source)?;
        Ok(Io {
            source: Some(source),
            registration,
            read_timeout: AtomicU64::new(NO_TIMEOUT),
            write_timeout: AtomicU64::new(NO_TIMEOUT),
            nonblocking: AtomicBool::new(false),
        })
    }

    #[inline]
    pub(crate) fn get(&self) -> &S {
        match &self.source {
            Some(source) => source,
            None => unreachable!("fiber-net: a socket was used after into_inner"),
        }
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
    pub(crate) fn read<K, R>(&self, op: impl FnMut(&S) -> io::Result<R>) -> io::Result<R> {
        let deadline = deadline(&self.read_timeout);
        self.poll::<K, R>(READ, deadline, OnTimeout::WouldBlock, op)
    }

    /// As [`read`](Self::read) for writing.
    #[inline]
    pub(crate) fn write<K, R>(&self, op: impl FnMut(&S) -> io::Result<R>) -> io::Result<R> {
        let deadline = deadline(&self.write_timeout);
        self.poll::<K, R>(WRITE, deadline, OnTimeout::WouldBlock, op)
    }

    /// Run `op` until it does not block, for `dir`, with an explicit deadline.
    pub(crate) fn poll<K, R>(
        &self,
        dir: usize,
        deadline: Option<Instant>,
        on_timeout: OnTimeout,
        mut op: impl FnMut(&S) -> io::Result<R>,
    ) -> io::Result<R> {
        let source = self.get();
        let nonblocking = self.nonblocking.load(Ordering::Relaxed);
        self.registration
            .readiness
            .poll_io::<K, R>(dir, deadline, on_timeout, nonblocking, || op(source))
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        set_timeout(&self.read_timeout, timeout)
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        set_timeout(&self.write_timeout, timeout)
    }

    pub(crate) fn read_timeout(&self) -> Option<Duration> {
        get_timeout(&self.read_timeout)
    }

    pub(crate) fn write_timeout(&self) -> Option<Duration> {
        get_timeout(&self.write_timeout)
    }

    pub(crate) fn set_nonblocking(&self, nonblocking: bool) {
        self.nonblocking.store(nonblocking, Ordering::Relaxed);
    }
}

impl<S: Source> Drop for Io<S> {
    fn drop(&mut self) {
        if let Some(source) = self.source.as_mut() {
            self.registration.deregister(source);
        }
    }
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
        Some(d) => u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1),
    };
    cell.store(nanos, Ordering::Relaxed);
    Ok(())
}

fn get_timeout(cell: &AtomicU64) -> Option<Duration> {
    match cell.load(Ordering::Relaxed) {
        NO_TIMEOUT => None,
        n => Some(Duration::from_nanos(n)),
    }
}

#[inline]
fn deadline(cell: &AtomicU64) -> Option<Instant> {
    match cell.load(Ordering::Relaxed) {
        NO_TIMEOUT => None,
        // A timeout too long for `Instant` is no timeout.
        n => Instant::now().checked_add(Duration::from_nanos(n)),
    }
}
