//! Loom models of the readiness protocol: threads wait through fiber-core's
//! plain-thread park path, so `Readiness::poll_io`, the waitable, the wait
//! protocol and the state word all run for real. The kernel's receive
//! buffer is a loom mutex (the socket lock); the poller is a thread that
//! fills it and then delivers the edge, as epoll does.

use crate::readiness::{op, OnTimeout, Readiness, READ};
use crate::sync::{lock, Arc, Mutex};
use loom::thread;
use std::io;

/// A non-blocking read of the modelled kernel buffer.
fn try_read(kernel: &Mutex<bool>) -> io::Result<u8> {
    if std::mem::take(&mut *lock(kernel)) {
        Ok(1)
    } else {
        Err(io::ErrorKind::WouldBlock.into())
    }
}

/// Readiness vs park: the data and its (single, edge-triggered) event
/// arrive at any point of the reader's snapshot / read / publish / park
/// sequence; the reader always gets the byte and never sleeps forever.
/// Removing the sequence re-check from `ReadyWait::publish` makes loom
/// report a deadlock (the event landed between the `WouldBlock` and the
/// publication, and nothing repeats it).
#[test]
fn loom_readiness_vs_park() {
    loom::model(|| {
        let readiness = Arc::new(Readiness::new());
        let kernel = Arc::new(Mutex::new(false));
        let poller = {
            let (readiness, kernel) = (readiness.clone(), kernel.clone());
            thread::spawn(move || {
                *lock(&kernel) = true;
                readiness.set_ready(true, false);
            })
        };
        let got = readiness.poll_io::<op::Read, _>(READ, None, OnTimeout::WouldBlock, false, || try_read(&kernel));
        assert_eq!(got.unwrap(), 1);
        poller.join().unwrap();
    });
}

/// Deregistration vs park: a close racing a reader that finds no data ends
/// the wait with the "closed" error; it never sleeps forever.
#[test]
fn loom_close_vs_park() {
    loom::model(|| {
        let readiness = Arc::new(Readiness::new());
        let kernel = Arc::new(Mutex::new(false));
        let closer = {
            let readiness = readiness.clone();
            thread::spawn(move || readiness.close())
        };
        let got = readiness.poll_io::<op::Read, _>(READ, None, OnTimeout::WouldBlock, false, || try_read(&kernel));
        assert_eq!(got.unwrap_err().kind(), io::ErrorKind::NotConnected);
        closer.join().unwrap();
    });
}
