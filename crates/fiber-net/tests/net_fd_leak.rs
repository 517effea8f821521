//! No file descriptor outlives its socket: one test alone in its binary so
//! that no other test opens fds meanwhile.

mod common;

use common::{line_echo_server, open_fds};
use fiber_net::{TcpListener, TcpStream, UdpSocket};
use fiber_sched::Runtime;
use std::io::{BufRead, BufReader, Read, Write};
use std::time::Duration;

#[test]
fn sockets_leave_no_fd_behind() {
    // Start the I/O driver (its epoll fd lives as long as the process).
    drop(TcpListener::bind("127.0.0.1:0").unwrap());
    let before = open_fds();
    let rt = Runtime::builder().workers(2).build().unwrap();
    rt.block_on(|| {
        let (addr, _) = line_echo_server();
        let clients: Vec<_> = (0..100)
            .map(|i| {
                fiber_core::spawn(move || {
                    let s = TcpStream::connect(addr).unwrap();
                    match i % 4 {
                        // A full round trip through a clone.
                        0 => {
                            let reader = s.try_clone().unwrap();
                            (&s).write_all(b"hi\n").unwrap();
                            let mut line = String::new();
                            BufReader::new(&reader).read_line(&mut line).unwrap();
                            assert_eq!(line, "hi\n");
                        }
                        // Vanish mid-request.
                        1 => (&s).write_all(b"half").unwrap(),
                        // Round trip through std and back.
                        2 => {
                            let std = s.into_std().unwrap();
                            let s = TcpStream::from_std(std).unwrap();
                            (&s).write_all(b"x\n").unwrap();
                            let mut buf = [0; 2];
                            (&s).read_exact(&mut buf).unwrap();
                        }
                        // A timed-out read.
                        _ => {
                            s.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
                            assert!((&s).read(&mut [0; 4]).is_err());
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = a.try_clone().unwrap();
        a.send_to(b"u", a.local_addr().unwrap()).unwrap();
        b.recv_from(&mut [0; 4]).unwrap();
        // A fiber parked in accept when its task is cancelled.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let parked = fiber_core::spawn(move || listener.accept().map(|_| ()));
        while fiber_net::io_waiters() == 0 {
            let _ = fiber_core::yield_now();
        }
        parked.cancel();
        let _ = parked.join();
    });
    // The echo server's acceptor and handlers are still parked: shutdown
    // unwinds them and their sockets close.
    rt.shutdown_timeout(Duration::ZERO);
    let after = open_fds();
    assert_eq!(before, after, "fds before {before}, after {after}");
}
