//! fiber-net depends on fiber-core's contract only: the same sockets park
//! fibers of fiber-core's single-threaded `TestScheduler`, woken by the
//! poller thread through `fiber_wake`.

use fiber_core::testing::TestScheduler;
use fiber_net::{TcpListener, TcpStream};
use std::io::{Read, Write};

#[test]
fn sockets_park_fibers_of_the_test_scheduler() {
    let sched = TestScheduler::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = sched.spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut buf = [0; 5];
        conn.read_exact(&mut buf).unwrap();
        conn.write_all(&buf).unwrap();
        buf
    });
    let client = sched.spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"hello").unwrap();
        let mut back = [0; 5];
        s.read_exact(&mut back).unwrap();
        back
    });
    // One thread runs both fibers: every wait parks a fiber, never the
    // thread, or this would hang.
    sched.run();
    assert_eq!(&server.join().unwrap(), b"hello");
    assert_eq!(&client.join().unwrap(), b"hello");
}
