//! Deregistration wakes waiters: a fiber and a thread parked on a socket's
//! readiness when it is closed both wake with the "closed" error.

use crate::readiness::{op, OnTimeout, Readiness, READ, WRITE};
use std::io;
use std::sync::Arc;

fn park_until_closed(readiness: &Readiness, dir: usize) -> io::Error {
    readiness
        .poll_io::<op::Read, _>(dir, None, OnTimeout::WouldBlock, false, || {
            Err::<(), _>(io::ErrorKind::WouldBlock.into())
        })
        .unwrap_err()
}

#[test]
fn close_wakes_parked_fibers_and_threads_with_an_error() {
    let readiness = Arc::new(Readiness::new());
    let rt = fiber_sched::Runtime::builder().workers(1).build().unwrap();
    let in_fiber = {
        let r = readiness.clone();
        rt.spawn(move || park_until_closed(&r, READ).kind())
    };
    let in_thread = {
        let r = readiness.clone();
        std::thread::spawn(move || park_until_closed(&r, WRITE).kind())
    };
    while crate::io_waiters() < 2 {
        std::thread::yield_now();
    }
    readiness.close();
    assert_eq!(in_fiber.join().unwrap(), io::ErrorKind::NotConnected);
    assert_eq!(in_thread.join().unwrap(), io::ErrorKind::NotConnected);
    // Later waits end at once.
    assert_eq!(park_until_closed(&readiness, READ).kind(), io::ErrorKind::NotConnected);
}
