//! A TCP echo server, one fiber per connection, with `fiber::net` (the
//! `std::net` API; accept, read and write park the fiber, not the thread).
//!
//! `cargo run --release --example echo -- --addr 127.0.0.1:7000`
//! `cargo run --release --example echo -- --self-check` (ephemeral port,
//! 100 clients, exits 0 when every echo came back)

use fiber::net::{TcpListener, TcpStream};
use std::io::{self, Read, Write};
use std::net::SocketAddr;

/// Serve every connection of `listener` in its own fiber, forever.
pub fn serve(listener: TcpListener) -> io::Result<()> {
    for conn in listener.incoming() {
        let conn = conn?;
        fiber::spawn(move || {
            // A peer that resets the connection just ends its fiber.
            let _ = echo(conn);
        });
    }
    Ok(())
}

fn echo(mut conn: TcpStream) -> io::Result<()> {
    let mut buf = [0; 16 * 1024];
    loop {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        conn.write_all(&buf[..n])?;
    }
}

/// `clients` fibers each send `rounds` messages and check the echoes.
pub fn self_check(addr: SocketAddr, clients: usize, rounds: usize) -> io::Result<()> {
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            fiber::spawn(move || -> io::Result<()> {
                let mut s = TcpStream::connect(addr)?;
                for r in 0..rounds {
                    let msg = format!("client {c} round {r}");
                    s.write_all(msg.as_bytes())?;
                    let mut back = vec![0; msg.len()];
                    s.read_exact(&mut back)?;
                    if back != msg.as_bytes() {
                        return Err(io::Error::other(format!("client {c}: wrong echo")));
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|e| io::Error::other(e.to_string()))??;
    }
    Ok(())
}

fn args() -> (String, bool) {
    let mut addr = "127.0.0.1:7000".to_string();
    let mut check = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().expect("--addr needs a value, e.g. 127.0.0.1:7000"),
            "--self-check" => check = true,
            other => panic!("unknown argument {other:?} (expected --addr HOST:PORT or --self-check)"),
        }
    }
    (addr, check)
}

#[allow(dead_code)]
fn main() -> io::Result<()> {
    let (addr, check) = args();
    fiber::run(move || {
        if check {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let addr = listener.local_addr()?;
            fiber::spawn(move || serve(listener));
            self_check(addr, 100, 10)?;
            println!("echo: self-check passed (100 clients x 10 round trips on {addr})");
            Ok(())
        } else {
            let listener = TcpListener::bind(&addr)?;
            println!("echo: listening on {}", listener.local_addr()?);
            serve(listener)
        }
    })
}
