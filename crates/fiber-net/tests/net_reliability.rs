//! A slow client does not delay the others; clients vanishing mid-request
//! end their handlers; a server dropped under load leaves nothing behind.

mod common;

use common::{eventually, line_echo_server, HANG};
use fiber_sched::Runtime;
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn rt() -> Runtime {
    Runtime::builder().workers(2).build().unwrap()
}

fn round_trips(addr: std::net::SocketAddr, n: usize) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(HANG)).unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for i in 0..n {
        let line = format!("line {i}\n");
        s.write_all(line.as_bytes()).unwrap();
        let mut back = String::new();
        reader.read_line(&mut back).unwrap();
        assert_eq!(back, line);
    }
}

/// A client sending one byte per 100 ms keeps its request open until 20
/// fast clients have finished all their round trips on the same server:
/// nothing the slow client does holds a worker.
#[test]
fn a_slow_client_does_not_delay_the_others() {
    let rt = rt();
    let (addr, _) = rt.block_on(line_echo_server);
    let fast_done = Arc::new(AtomicBool::new(false));
    let slow = {
        let fast_done = fast_done.clone();
        std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(HANG)).unwrap();
            let mut sent = 0;
            // One byte per 100 ms, no newline, until the fast clients are
            // done (bounded by the hang limit).
            while !fast_done.load(Ordering::SeqCst) && sent < HANG.as_millis() / 100 {
                s.write_all(b"s").unwrap();
                sent += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            let finished_while_open = fast_done.load(Ordering::SeqCst);
            s.write_all(b"\n").unwrap();
            let mut back = String::new();
            BufReader::new(s).read_line(&mut back).unwrap();
            assert_eq!(back.len() as u128, sent + 1);
            finished_while_open
        })
    };
    let fast: Vec<_> = (0..20)
        .map(|_| std::thread::spawn(move || round_trips(addr, 10)))
        .collect();
    for f in fast {
        f.join().unwrap();
    }
    fast_done.store(true, Ordering::SeqCst);
    assert!(
        slow.join().unwrap(),
        "the fast clients finished while the slow request was open"
    );
}

/// Clients that send half a request and vanish (closed, or reset with
/// SO_LINGER 0) end their handler fibers; the server keeps serving.
#[test]
fn clients_vanishing_mid_request_end_their_handlers() {
    let rt = rt();
    let (addr, counts) = rt.block_on(line_echo_server);
    for i in 0..50 {
        let s = std::net::TcpStream::connect(addr).unwrap();
        (&s).write_all(b"half a requ").unwrap();
        if i % 2 == 0 {
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: a valid socket fd and a pointer to a linger struct of
            // the size passed.
            let rc = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&s),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&linger as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                )
            };
            assert_eq!(rc, 0);
        }
        drop(s);
    }
    assert!(
        eventually(|| counts.finished.load(Ordering::SeqCst) == 50),
        "handlers finished: {counts:?}"
    );
    round_trips(addr, 3);
}

/// Shutting the runtime down while handlers are parked in reads and
/// clients are mid-conversation: no hang, every client sees its connection
/// end, and no socket stays registered (no waiter left).
#[test]
fn a_server_dropped_under_load_ends_every_connection() {
    let rt = rt();
    let (addr, counts) = rt.block_on(line_echo_server);
    let clients: Vec<_> = (0..40)
        .map(|_| {
            std::thread::spawn(move || {
                let mut s = std::net::TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(HANG)).unwrap();
                let mut reader = BufReader::new(s.try_clone().unwrap());
                // Talk until the server goes away.
                for i in 0.. {
                    if s.write_all(format!("{i}\n").as_bytes()).is_err() {
                        return;
                    }
                    let mut back = String::new();
                    match reader.read_line(&mut back) {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
        })
        .collect();
    assert!(eventually(|| counts.accepted.load(Ordering::SeqCst) == 40));
    rt.shutdown_timeout(Duration::ZERO);
    for c in clients {
        c.join().unwrap();
    }
    assert!(eventually(|| fiber_net::io_waiters() == 0));
}
