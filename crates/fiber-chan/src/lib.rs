//! Channels for fibers and threads: rendezvous-first bounded and unbounded
//! MPMC channels with exact close semantics, timers for `select!`, and
//! `select!` itself, with crossbeam-channel's API and error types.
//!
//! In a fiber a blocking operation parks the fiber (through fiber-core's
//! `fiber_wait`); on a plain thread it blocks the thread; a fiber and a
//! thread can share one channel. The rules are in `spec/chan.md`.
//!
//! # Examples
//!
//! ```
//! # mod fiber { pub(crate) use fiber_chan as chan; }
//! use fiber::chan::bounded;
//!
//! let (tx, rx) = bounded(0); // rendezvous
//! let producer = std::thread::spawn(move || {
//!     for i in 0..3 {
//!         tx.send(i).unwrap();
//!     }
//! });
//! assert_eq!(rx.iter().collect::<Vec<_>>(), [0, 1, 2]);
//! producer.join().unwrap();
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

mod sync;

mod chan;
mod channel;
mod error;
mod macros;
mod ring;
mod select;

pub use channel::{after, at, bounded, never, tick, unbounded, IntoIter, Iter, Receiver, Sender, TryIter};
pub use error::{
    ReadyTimeoutError, RecvError, RecvTimeoutError, SelectTimeoutError, SendError, SendTimeoutError, TryReadyError,
    TryRecvError, TrySelectError, TrySendError,
};
pub use select::{__MacroSelect, Select, SelectedOperation};

#[doc(hidden)]
#[cfg(all(test, loom))]
mod tests;
