//! A minimal HTTP/1.1 server: keep-alive, pipelining, `Content-Length`
//! responses, requests parsed with `httparse`; one fiber per connection on
//! `fiber::net`. The server `cargo xtask loadtest` measures.
//!
//! `cargo run --release --example http_hello -- --addr 127.0.0.1:8080`
//! `cargo run --release --example http_hello -- --self-check`

use fiber::net::{TcpListener, TcpStream};
use std::io::{self, Read, Write};
use std::net::SocketAddr;

const BODY: &[u8] = b"Hello, world!";
const MAX_HEADERS: usize = 32;
/// Requests larger than this (head) are refused with 431.
const MAX_HEAD: usize = 64 * 1024;

/// Serve every connection of `listener` in its own fiber, forever.
pub fn serve(listener: TcpListener) -> io::Result<()> {
    for conn in listener.incoming() {
        let conn = conn?;
        fiber::spawn(move || {
            let _ = conn.set_nodelay(true);
            // A peer that vanishes just ends its fiber.
            let _ = handle(conn);
        });
    }
    Ok(())
}

fn response(out: &mut Vec<u8>, status: &str, body: &[u8], close: bool) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: text/plain\r\nContent-Length: ");
    out.extend_from_slice(body.len().to_string().as_bytes());
    if close {
        out.extend_from_slice(b"\r\nConnection: close");
    }
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body);
}

fn handle(mut conn: TcpStream) -> io::Result<()> {
    let mut buf = vec![0u8; 8 * 1024];
    let mut filled = 0;
    let mut out = Vec::with_capacity(1024);
    loop {
        // Answer every complete request in the buffer (pipelining), then
        // write the answers in one go.
        let mut start = 0;
        let mut close = false;
        loop {
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf[start..filled]) {
                Ok(httparse::Status::Complete(head)) => {
                    let mut body_len = 0usize;
                    let mut keep_alive = req.version == Some(1);
                    for h in req.headers.iter() {
                        if h.name.eq_ignore_ascii_case("content-length") {
                            body_len = std::str::from_utf8(h.value)
                                .ok()
                                .and_then(|v| v.trim().parse().ok())
                                .unwrap_or(usize::MAX);
                        } else if h.name.eq_ignore_ascii_case("connection") {
                            if h.value.eq_ignore_ascii_case(b"close") {
                                keep_alive = false;
                            } else if h.value.eq_ignore_ascii_case(b"keep-alive") {
                                keep_alive = true;
                            }
                        }
                    }
                    if body_len > MAX_HEAD || start + head + body_len > filled {
                        if body_len > MAX_HEAD {
                            response(&mut out, "413 Payload Too Large", b"", true);
                            close = true;
                        }
                        break; // wait for the body
                    }
                    start += head + body_len;
                    close = !keep_alive;
                    response(&mut out, "200 OK", BODY, close);
                    if close {
                        break;
                    }
                }
                Ok(httparse::Status::Partial) => break,
                Err(_) => {
                    response(&mut out, "400 Bad Request", b"", true);
                    close = true;
                    break;
                }
            }
        }
        if !out.is_empty() {
            conn.write_all(&out)?;
            out.clear();
        }
        if close {
            return Ok(());
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
        if filled == buf.len() {
            if buf.len() >= MAX_HEAD {
                response(&mut out, "431 Request Header Fields Too Large", b"", true);
                return conn.write_all(&out);
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = conn.read(&mut buf[filled..])?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
    }
}

/// Check the server at `addr`: keep-alive, pipelining, `Connection:
/// close`, a request split across writes, a body, and a bad request.
pub fn self_check(addr: SocketAddr) -> io::Result<()> {
    fn read_responses(s: &mut TcpStream, n: usize) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let mut buf = Vec::new();
        let mut got = Vec::new();
        let mut chunk = [0; 4096];
        while got.len() < n {
            let read = s.read(&mut chunk)?;
            if read == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed early"));
            }
            buf.extend_from_slice(&chunk[..read]);
            loop {
                let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut resp = httparse::Response::new(&mut headers);
                let Ok(httparse::Status::Complete(head)) = resp.parse(&buf) else {
                    break;
                };
                let len: usize = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.parse().ok())
                    .ok_or_else(|| io::Error::other("response without Content-Length"))?;
                if buf.len() < head + len {
                    break;
                }
                got.push((resp.code.unwrap_or(0), buf[head..head + len].to_vec()));
                buf.drain(..head + len);
            }
        }
        Ok(got)
    }
    let check = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(io::Error::other(format!("http_hello: {what}")))
        }
    };

    let mut s = TcpStream::connect(addr)?;
    // Keep-alive: three requests, one at a time, on one connection.
    for _ in 0..3 {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let r = read_responses(&mut s, 1)?;
        check(r == [(200, BODY.to_vec())], "keep-alive response")?;
    }
    // Pipelining, a body, and a request split across two writes.
    s.write_all(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")?;
    s.write_all(b"GET /c HTTP/1.1\r\nHo")?;
    s.flush()?;
    let _ = fiber::sleep(std::time::Duration::from_millis(5));
    s.write_all(b"st: x\r\n\r\n")?;
    let r = read_responses(&mut s, 3)?;
    check(
        r.iter().all(|(code, body)| *code == 200 && body == BODY),
        "pipelined responses",
    )?;
    // Connection: close ends the connection after the answer.
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    check(read_responses(&mut s, 1)?[0].0 == 200, "close response")?;
    let mut rest = Vec::new();
    s.read_to_end(&mut rest)?;
    check(rest.is_empty(), "nothing after Connection: close")?;
    // Garbage gets a 400 and the connection closes.
    let mut bad = TcpStream::connect(addr)?;
    bad.write_all(b"\x00\x01 not http\r\n\r\n")?;
    check(read_responses(&mut bad, 1)?[0].0 == 400, "bad request")?;
    // Many clients at once.
    let clients: Vec<_> = (0..50)
        .map(|_| {
            fiber::spawn(move || -> io::Result<bool> {
                let mut s = TcpStream::connect(addr)?;
                for _ in 0..5 {
                    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")?;
                }
                Ok(read_responses(&mut s, 5)?.iter().all(|(c, b)| *c == 200 && b == BODY))
            })
        })
        .collect();
    for c in clients {
        let ok = c.join().map_err(|e| io::Error::other(e.to_string()))??;
        check(ok, "concurrent clients")?;
    }
    Ok(())
}

fn args() -> (String, bool) {
    let mut addr = "127.0.0.1:8080".to_string();
    let mut check = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().expect("--addr needs a value, e.g. 127.0.0.1:8080"),
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
            self_check(addr)?;
            println!("http_hello: self-check passed on {addr}");
            Ok(())
        } else {
            let listener = TcpListener::bind(&addr)?;
            println!("http_hello: listening on http://{}", listener.local_addr()?);
            serve(listener)
        }
    })
}
