//! Helpers shared by the integration tests.
#![allow(dead_code)]

use fiber_net::{TcpListener, TcpStream};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Hang detection only: far above any healthy run on a loaded machine.
pub const HANG: Duration = Duration::from_secs(120);

/// Counters of a line-echo server.
#[derive(Default, Debug)]
pub struct ServerCounts {
    pub accepted: AtomicUsize,
    pub finished: AtomicUsize,
}

/// Start a line-echo server in a fiber of the current runtime: one fiber
/// per connection, echoing each `\n`-terminated line until EOF or error.
pub fn line_echo_server() -> (SocketAddr, Arc<ServerCounts>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(ServerCounts::default());
    let c = counts.clone();
    fiber_core::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            c.accepted.fetch_add(1, Ordering::SeqCst);
            let c = c.clone();
            fiber_core::spawn(move || {
                serve_lines(conn);
                c.finished.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    (addr, counts)
}

fn serve_lines(conn: TcpStream) {
    let mut reader = BufReader::new(&conn);
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if !line.ends_with('\n') || (&conn).write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
        }
    }
}

/// Wait (polling, bounded by [`HANG`]) until `f` holds.
pub fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + HANG;
    while std::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    f()
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Raise the soft `RLIMIT_NOFILE` to at least `want` (and the hard limit
/// with it when the process may); returns the soft limit in force.
pub fn raise_nofile(want: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    if limit.rlim_cur < want {
        // A privileged process may raise the hard limit too; otherwise
        // go as far as the hard limit allows.
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: limit.rlim_max.max(want),
        };
        // SAFETY: a valid pointer to an rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = want;
        } else {
            let capped = libc::rlimit {
                rlim_cur: want.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            // SAFETY: as above, within the hard limit.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &capped) } == 0 {
                limit.rlim_cur = capped.rlim_cur;
            }
        }
    }
    limit.rlim_cur
}
