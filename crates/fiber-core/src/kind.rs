//! What a parked fiber waits for, as diagnostics name it.

use std::fmt;

/// What a parked fiber waits for (see `Waitable::kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum WaitKind {
    /// Not waiting (or nothing recorded).
    None = 0,
    /// `sleep`, `sleep_until`, a plain deadline.
    Sleep = 1,
    /// A channel receive.
    Recv = 2,
    /// A channel send.
    Send = 3,
    /// A `select!` / `Select` over several operations.
    Select = 4,
    /// Joining a fiber or a job, or a scope waiting for its children.
    Join = 5,
    /// `fiber::park`.
    Park = 6,
    /// A fiber-aware lock, condition variable, semaphore, barrier or group.
    Lock = 7,
    /// Socket readiness (read, write, accept, connect).
    Io = 8,
    /// Any other waitable.
    Other = 9,
    /// A call running on the blocking pool (`fiber::blocking`).
    Blocking = 10,
}

impl WaitKind {
    pub(crate) fn from_u8(v: u8) -> WaitKind {
        match v {
            1 => WaitKind::Sleep,
            2 => WaitKind::Recv,
            3 => WaitKind::Send,
            4 => WaitKind::Select,
            5 => WaitKind::Join,
            6 => WaitKind::Park,
            7 => WaitKind::Lock,
            8 => WaitKind::Io,
            9 => WaitKind::Other,
            10 => WaitKind::Blocking,
            _ => WaitKind::None,
        }
    }

    /// A short human name ("chan receive", "sleep", ...).
    pub fn name(self) -> &'static str {
        match self {
            WaitKind::None => "nothing",
            WaitKind::Sleep => "sleep",
            WaitKind::Recv => "chan receive",
            WaitKind::Send => "chan send",
            WaitKind::Select => "select",
            WaitKind::Join => "join",
            WaitKind::Park => "park",
            WaitKind::Lock => "waiting for lock",
            WaitKind::Io => "I/O",
            WaitKind::Other => "wait",
            WaitKind::Blocking => "blocking call",
        }
    }
}

impl fmt::Display for WaitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
