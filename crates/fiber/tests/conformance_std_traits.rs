//! The auto and marker traits std's types have, which code ported from
//! std relies on: `std::sync::Mutex` and `RwLock` are `UnwindSafe` and
//! `RefUnwindSafe` whatever they hold (poisoning is their answer to a
//! panic), so a test may poison one with `catch_unwind(|| { let _g =
//! m.lock(); panic!() })`; std's sockets, `Condvar`, `Barrier` and
//! `OnceLock` are unwind-safe too.

use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock};
use std::cell::Cell;
use std::panic::{catch_unwind, RefUnwindSafe, UnwindSafe};

mod common;
use common::{ms, within};

fn unwind_safe<T: UnwindSafe + RefUnwindSafe + ?Sized>() {}
fn send_sync<T: Send + Sync + ?Sized>() {}

#[test]
fn sync_and_net_types_are_unwind_safe_like_std_s() {
    // As std: whatever the lock holds, even a `Cell`.
    unwind_safe::<Mutex<Cell<u8>>>();
    unwind_safe::<RwLock<Cell<u8>>>();
    unwind_safe::<Mutex<[u8]>>();
    unwind_safe::<Condvar>();
    unwind_safe::<Barrier>();
    unwind_safe::<OnceLock<u8>>();
    unwind_safe::<fiber::sync::MutexGuard<'static, u8>>();
    unwind_safe::<fiber::sync::Semaphore>();
    unwind_safe::<fiber::sync::WaitGroup>();
    unwind_safe::<fiber::net::TcpStream>();
    unwind_safe::<fiber::net::TcpListener>();
    unwind_safe::<fiber::net::UdpSocket>();
    unwind_safe::<fiber::net::unix::UnixStream>();
    unwind_safe::<fiber::net::unix::UnixListener>();
    unwind_safe::<fiber::net::unix::UnixDatagram>();
    unwind_safe::<fiber::FiberHandle>();
    send_sync::<fiber::FiberHandle>();
    send_sync::<Mutex<u8>>();
    send_sync::<RwLock<u8>>();
    send_sync::<fiber::net::TcpStream>();
}

/// The std idiom: poison a lock with `catch_unwind` over a closure that
/// borrows it (no `AssertUnwindSafe`), in a fiber and on a thread.
#[test]
fn catch_unwind_over_a_borrowed_lock_poisons_it() {
    fn body() {
        let m = Mutex::new(1);
        let l = RwLock::new(1);
        let r = catch_unwind(|| {
            let _g = m.lock().unwrap();
            let _w = l.write().unwrap();
            panic!("poison both");
        });
        assert!(r.is_err());
        assert!(m.is_poisoned() && l.is_poisoned());
    }
    within(30, || {
        fiber::Runtime::builder()
            .workers(2)
            .shutdown_timeout(ms(500))
            .build()
            .unwrap()
            .block_on(body)
    });
    within(30, body);
}

/// As std: a lock of an unsized value through unsizing coercion.
#[test]
fn locks_of_unsized_values_coerce_like_std_s() {
    let m: std::sync::Arc<Mutex<[u32]>> = std::sync::Arc::new(Mutex::new([1, 2, 3]));
    m.lock().unwrap()[1] = 5;
    assert_eq!(&*m.lock().unwrap(), &[1, 5, 3]);
    let l: Box<RwLock<dyn std::fmt::Debug + Send + Sync>> = Box::new(RwLock::new(7u8));
    assert_eq!(format!("{:?}", &*l.read().unwrap()), "7");
}
