//! Channel errors, shaped like `std::sync::mpsc` and crossbeam-channel so
//! code and tests port unchanged. Every error that did not deliver a value
//! gives it back.

use std::error::Error;
use std::fmt;

/// `send` failed: the channel is closed or every receiver is gone. The value
/// comes back.
#[derive(PartialEq, Eq, Clone, Copy)]
pub struct SendError<T>(pub T);

/// `try_send` failed.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum TrySendError<T> {
    /// The channel is full (or, for a rendezvous channel, no receiver waits).
    Full(T),
    /// The channel is closed or every receiver is gone.
    Disconnected(T),
}

/// `send_timeout` / `send_deadline` failed.
#[derive(PartialEq, Eq, Clone, Copy)]
pub enum SendTimeoutError<T> {
    /// The deadline passed (or the sending fiber was cancelled) first.
    Timeout(T),
    /// The channel is closed or every receiver is gone.
    Disconnected(T),
}

/// `recv` failed: the channel is closed (or every sender is gone) and empty.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct RecvError;

/// `try_recv` failed.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub enum TryRecvError {
    /// Nothing to receive right now.
    Empty,
    /// Closed and empty.
    Disconnected,
}

/// `recv_timeout` / `recv_deadline` failed.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub enum RecvTimeoutError {
    /// The deadline passed (or the receiving fiber was cancelled) first.
    Timeout,
    /// Closed and empty.
    Disconnected,
}

/// `Select::try_select` found no ready operation.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct TrySelectError;

/// `Select::try_ready` found no ready operation (crossbeam's
/// `TryReadyError`).
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct TryReadyError;

/// `Select::ready_timeout` timed out.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct ReadyTimeoutError;

impl fmt::Display for TryReadyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("all operations in select would block")
    }
}

impl Error for TryReadyError {}

impl fmt::Display for ReadyTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("timed out waiting on ready")
    }
}

impl Error for ReadyTimeoutError {}

/// `Select::select_timeout` timed out.
#[derive(PartialEq, Eq, Clone, Copy, Debug)]
pub struct SelectTimeoutError;

impl<T> SendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> TrySendError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            TrySendError::Full(v) | TrySendError::Disconnected(v) => v,
        }
    }

    /// Was the channel full?
    pub fn is_full(&self) -> bool {
        matches!(self, TrySendError::Full(_))
    }

    /// Was the channel disconnected?
    pub fn is_disconnected(&self) -> bool {
        matches!(self, TrySendError::Disconnected(_))
    }
}

impl<T> SendTimeoutError<T> {
    /// The value that was not sent.
    pub fn into_inner(self) -> T {
        match self {
            SendTimeoutError::Timeout(v) | SendTimeoutError::Disconnected(v) => v,
        }
    }

    /// Did the deadline pass?
    pub fn is_timeout(&self) -> bool {
        matches!(self, SendTimeoutError::Timeout(_))
    }

    /// Was the channel disconnected?
    pub fn is_disconnected(&self) -> bool {
        matches!(self, SendTimeoutError::Disconnected(_))
    }
}

impl TryRecvError {
    /// Was the channel empty?
    pub fn is_empty(&self) -> bool {
        matches!(self, TryRecvError::Empty)
    }

    /// Was the channel disconnected?
    pub fn is_disconnected(&self) -> bool {
        matches!(self, TryRecvError::Disconnected)
    }
}

impl RecvTimeoutError {
    /// Did the deadline pass?
    pub fn is_timeout(&self) -> bool {
        matches!(self, RecvTimeoutError::Timeout)
    }

    /// Was the channel disconnected?
    pub fn is_disconnected(&self) -> bool {
        matches!(self, RecvTimeoutError::Disconnected)
    }
}

impl<T> From<SendError<T>> for TrySendError<T> {
    fn from(err: SendError<T>) -> Self {
        TrySendError::Disconnected(err.0)
    }
}

impl<T> From<SendError<T>> for SendTimeoutError<T> {
    fn from(err: SendError<T>) -> Self {
        SendTimeoutError::Disconnected(err.0)
    }
}

impl From<RecvError> for TryRecvError {
    fn from(_: RecvError) -> Self {
        TryRecvError::Disconnected
    }
}

impl From<RecvError> for RecvTimeoutError {
    fn from(_: RecvError) -> Self {
        RecvTimeoutError::Disconnected
    }
}

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Debug for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.write_str("Full(..)"),
            TrySendError::Disconnected(_) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Debug for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(_) => f.write_str("Timeout(..)"),
            SendTimeoutError::Disconnected(_) => f.write_str("Disconnected(..)"),
        }
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("sending on a disconnected channel")
    }
}

impl<T> fmt::Display for TrySendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrySendError::Full(_) => f.pad("sending on a full channel"),
            TrySendError::Disconnected(_) => f.pad("sending on a disconnected channel"),
        }
    }
}

impl<T> fmt::Display for SendTimeoutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendTimeoutError::Timeout(_) => f.pad("timed out waiting on send operation"),
            SendTimeoutError::Disconnected(_) => f.pad("sending on a disconnected channel"),
        }
    }
}

impl fmt::Display for RecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("receiving on an empty and disconnected channel")
    }
}

impl fmt::Display for TryRecvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryRecvError::Empty => f.pad("receiving on an empty channel"),
            TryRecvError::Disconnected => f.pad("receiving on an empty and disconnected channel"),
        }
    }
}

impl fmt::Display for RecvTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecvTimeoutError::Timeout => f.pad("timed out waiting on receive operation"),
            RecvTimeoutError::Disconnected => f.pad("channel is empty and disconnected"),
        }
    }
}

impl fmt::Display for TrySelectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("all operations in select would block")
    }
}

impl fmt::Display for SelectTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("timed out waiting on select")
    }
}

impl<T> Error for SendError<T> {}
impl<T> Error for TrySendError<T> {}
impl<T> Error for SendTimeoutError<T> {}
impl Error for RecvError {}
impl Error for TryRecvError {}
impl Error for RecvTimeoutError {}
impl Error for TrySelectError {}
impl Error for SelectTimeoutError {}
