//! Adversarial: running out of file descriptors at the first socket call of the
//! process must be an ordinary, transient error (as with std): once fds are
//! free again, sockets work. (Only test in this binary: the I/O driver is
//! process-wide and must not have started yet.)

use std::fs::File;
use std::time::Duration;

#[repr(C)]
struct RLimit {
    cur: u64,
    max: u64,
}
extern "C" {
    fn getrlimit(resource: i32, rlim: *mut RLimit) -> i32;
    fn setrlimit(resource: i32, rlim: *const RLimit) -> i32;
}
const RLIMIT_NOFILE: i32 = 7;

#[test]
fn fd_exhaustion_at_first_use_is_not_permanent() {
    let mut old = RLimit { cur: 0, max: 0 };
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { getrlimit(RLIMIT_NOFILE, &mut old) }, 0);
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    let low = RLimit {
        cur: open + 16,
        max: old.max,
    };
    // SAFETY: valid pointer.
    assert_eq!(unsafe { setrlimit(RLIMIT_NOFILE, &low) }, 0);
    let mut fillers = Vec::new();
    loop {
        match File::open("/dev/null") {
            Ok(f) => fillers.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(24), "{e}");
                break;
            }
        }
    }
    // Room for exactly the two fds of a socket pair, not for the driver's epoll fd.
    fillers.pop();
    fillers.pop();
    let first = fiber::net::unix::UnixStream::pair();
    let first_err = first.as_ref().err().map(|e| e.to_string());
    drop(first);
    drop(fillers);
    // SAFETY: valid pointer.
    assert_eq!(unsafe { setrlimit(RLIMIT_NOFILE, &old) }, 0);
    std::thread::sleep(Duration::from_millis(50));

    // std: with fds available again, sockets work.
    let std_ok = std::net::TcpListener::bind("127.0.0.1:0");
    assert!(std_ok.is_ok());
    let later = fiber::net::TcpListener::bind("127.0.0.1:0");
    assert!(
        later.is_ok(),
        "first call: {first_err:?}; a bind after fds were freed still fails: {:?}",
        later.err()
    );
    let pair = fiber::net::unix::UnixStream::pair();
    assert!(pair.is_ok(), "{:?}", pair.err());
}
