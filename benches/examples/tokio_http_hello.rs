//! The `http_hello` example's server written with tokio, for
//! `cargo xtask loadtest`: same parser (httparse), same responses, one task
//! per connection, a multi-threaded runtime with its default worker count.
//!
//! `cargo run --release -p benches --example tokio_http_hello -- --addr 127.0.0.1:8081`

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BODY: &[u8] = b"Hello, world!";
const MAX_HEADERS: usize = 32;
const MAX_HEAD: usize = 64 * 1024;

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

async fn handle(mut conn: TcpStream) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8 * 1024];
    let mut filled = 0;
    let mut out = Vec::with_capacity(1024);
    loop {
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
                        break;
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
            conn.write_all(&out).await?;
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
                return conn.write_all(&out).await;
            }
            buf.resize(buf.len() * 2, 0);
        }
        let n = conn.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut addr = "127.0.0.1:8081".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--addr" => addr = args.next().expect("--addr needs a value"),
            other => panic!("unknown argument {other:?} (expected --addr HOST:PORT)"),
        }
    }
    let listener = TcpListener::bind(&addr).await?;
    println!("tokio_http_hello: listening on http://{}", listener.local_addr()?);
    loop {
        let (conn, _) = listener.accept().await?;
        tokio::spawn(async move {
            let _ = conn.set_nodelay(true);
            let _ = handle(conn).await;
        });
    }
}
