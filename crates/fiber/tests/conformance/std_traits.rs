//! The auto and marker traits std's types have, which code ported from
//! std relies on: `std::sync::Mutex` and `RwLock` are `UnwindSafe` and
//! `RefUnwindSafe` whatever they hold (poisoning is their answer to a
//! panic), so a test may poison one with `catch_unwind(|| { let _g =
//! m.lock(); panic!() })`; std's sockets, `Condvar`, `Barrier` and
//! `OnceLock` are unwind-safe too.

use fiber::sync::{Barrier, Condvar, Mutex, OnceLock, RwLock};
use std::cell::Cell;
use std::panic::{catch_unwind, RefUnwindSafe, UnwindSafe};

use crate::common::{rt, within};

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
    within(30, || rt().block_on(body));
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

/// A port from `std::sync` is an import change: the error and result
/// types are importable from `fiber::sync` and are std's own.
#[test]
fn std_lock_result_types_are_importable_from_fiber_sync() {
    use fiber::sync::{LockResult, PoisonError, TryLockError, TryLockResult};
    let m = Mutex::new(1);
    let r: LockResult<fiber::sync::MutexGuard<'_, i32>> = m.lock();
    let g = r.unwrap();
    let t: TryLockResult<fiber::sync::MutexGuard<'_, i32>> = m.try_lock();
    assert!(matches!(t, Err(TryLockError::WouldBlock)));
    drop(g);
    let e: PoisonError<u8> = PoisonError::new(3);
    let from_std: std::sync::PoisonError<u8> = e;
    assert_eq!(from_std.into_inner(), 3);
}

/// Likewise for `std::net`: the address types and `Shutdown` come with
/// the sockets, so `use fiber::net::{TcpStream, Shutdown, SocketAddr}`
/// replaces the std import.
#[test]
fn std_net_types_are_importable_from_fiber_net() {
    use fiber::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};
    let a: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let _v4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
    let _v6 = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 1, 0, 0);
    let std_addr: std::net::SocketAddr = a;
    assert_eq!(std_addr.to_socket_addrs().unwrap().count(), 1);
    let _: std::net::Shutdown = Shutdown::Both;
    let _: fiber::net::AddrParseError = "x".parse::<SocketAddr>().unwrap_err();
    let _: Option<&fiber::net::unix::SocketAddr> = None::<&std::os::unix::net::SocketAddr>;
}
