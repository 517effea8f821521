//! 10,000 idle connections held open, each with a handler fiber parked in
//! a read; the server keeps answering meanwhile. The client ends live in a
//! child process (this test binary run again as `idle_clients_helper`), so
//! each process needs about 10,000 fds. Alone in its binary: it raises the
//! fd limit and counts fds.

mod common;

use common::{eventually, line_echo_server, open_fds, raise_nofile};
use fiber_net::TcpStream;
use fiber_sched::Runtime;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

const CONNECTIONS: usize = 10_000;
const ADDR_VAR: &str = "FIBER_NET_TEST_IDLE_ADDR";

#[test]
fn ten_thousand_idle_connections() {
    let need = (CONNECTIONS + 512) as u64;
    let limit = raise_nofile(need);
    if limit < need {
        eprintln!("skipped: RLIMIT_NOFILE is {limit} and cannot be raised to {need}");
        return;
    }
    drop(fiber_net::TcpListener::bind("127.0.0.1:0").unwrap());
    let before = open_fds();
    let rt = Runtime::builder().workers(2).build().unwrap();
    let (addr, counts) = rt.block_on(line_echo_server);
    let waiters_before = fiber_net::io_waiters();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "idle_clients_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ADDR_VAR, addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(|| counts.accepted.load(Ordering::SeqCst) == CONNECTIONS),
        "{counts:?}"
    );
    assert!(
        eventually(|| fiber_net::io_waiters() >= waiters_before + CONNECTIONS),
        "io waiters: {}",
        fiber_net::io_waiters()
    );
    // The server still answers a fresh client.
    rt.block_on(move || {
        let s = TcpStream::connect(addr).unwrap();
        (&s).write_all(b"still here\n").unwrap();
        let mut line = String::new();
        BufReader::new(&s).read_line(&mut line).unwrap();
        assert_eq!(line, "still here\n");
    });
    // Closing the child's stdin ends it and all its connections.
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert!(
        eventually(|| counts.finished.load(Ordering::SeqCst) == CONNECTIONS + 1),
        "{counts:?}"
    );
    rt.shutdown_timeout(Duration::ZERO);
    assert_eq!(open_fds(), before);
}

/// The client side of `ten_thousand_idle_connections`, run in a child
/// process by that test (ignored when run directly).
#[test]
#[ignore = "run by ten_thousand_idle_connections in a child process"]
fn idle_clients_helper() {
    let Ok(addr) = std::env::var(ADDR_VAR) else { return };
    raise_nofile((CONNECTIONS + 512) as u64);
    let conns: Vec<_> = (0..CONNECTIONS)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    assert_eq!(conns.len(), CONNECTIONS);
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    drop(conns);
}
