//! `cargo xtask loadtest [--duration SECS] [--rounds N]`: the `http_hello`
//! example (twice: as is, and with `FIBER_IO_HARVEST=0`, every socket event
//! left to the poller thread) against the same server written with tokio (`benches/examples/
//! tokio_http_hello.rs`) and with Go's net/http (`benches/go-http/http_hello.go`,
//! skipped with a note when `go` is missing), each driven by `wrk` at 50
//! and 1,000 connections for a fixed duration on 127.0.0.1 only. Prints
//! requests/s and p50/p99 latency side by side (medians of N rounds in
//! which the servers take turns) and writes
//! `target/loadtest/report.md`.
//!
//! `wrk` comes from the system (`apt-get install wrk`); when it is missing
//! and this runs as root, it is installed with apt-get, otherwise the load
//! test is skipped with a note.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONNECTIONS: &[u32] = &[50, 1000];
const DEFAULT_SECONDS: u64 = 10;
/// wrk's own threads (the machine's cores are shared by client and server,
/// the same for every server).
const WRK_THREADS: u32 = 2;

struct Server {
    name: &'static str,
    program: String,
    /// `--addr` for the Rust servers, `-addr` for Go's flag package.
    addr_flag: &'static str,
    /// Environment of the server process.
    env: &'static [(&'static str, &'static str)],
}

#[derive(Clone, Default)]
struct Row {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: String,
}

fn have(program: &str, arg: &str) -> bool {
    Command::new(program)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn ensure_wrk(notes: &mut Vec<String>) -> bool {
    if have("wrk", "--version") {
        return true;
    }
    eprintln!("==> wrk missing: trying apt-get install -y wrk");
    let ok = Command::new("apt-get")
        .args(["install", "-y", "wrk"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok && have("wrk", "--version") {
        return true;
    }
    notes.push("wrk is not installed and could not be installed (`apt-get install wrk`): load test skipped".into());
    false
}

fn free_addr() -> Result<SocketAddr, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map_err(|e| e.to_string())
}

/// Worker threads of every server: the machine's cores (tokio's default
/// `worker_threads`, Go's default `GOMAXPROCS`); fiber gets the same fixed
/// count (`workers = max_workers`, growth off), as in `cargo xtask bench
/// --fixed-workers`.
fn cores() -> String {
    std::thread::available_parallelism().map_or(1, |n| n.get()).to_string()
}

fn start(server: &Server, addr: SocketAddr) -> Result<Child, String> {
    let cores = cores();
    let fixed: &[(&str, &str)] = if server.name.starts_with("fiber") && !server.name.contains("elastic") {
        &[("FIBER_WORKERS", &cores), ("FIBER_MAX_WORKERS", &cores)]
    } else {
        &[]
    };
    let child = Command::new(&server.program)
        .args([server.addr_flag, &addr.to_string()])
        .envs(fixed.iter().copied())
        .envs(server.env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: could not start {}: {e}", server.name, server.program))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(addr).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{}: not listening on {addr} after 20 s", server.name))
}

/// "635.91us" / "1.20ms" / "2.00s" in milliseconds.
fn millis(text: &str) -> Option<f64> {
    let (num, scale) = if let Some(n) = text.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = text.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1e3)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

fn parse_wrk(out: &str) -> Option<Row> {
    let mut row = Row::default();
    let mut have_rps = false;
    for line in out.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => {
                row.rps = v.parse().ok()?;
                have_rps = true;
            }
            ["50%", v] => row.p50_ms = millis(v)?,
            ["99%", v] => row.p99_ms = millis(v)?,
            ["Socket", "errors:", rest @ ..] => row.errors = rest.join(" "),
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                row.errors = format!("{} non-2xx {n}", row.errors).trim().to_string()
            }
            _ => {}
        }
    }
    have_rps.then_some(row)
}

fn wrk(addr: SocketAddr, connections: u32, seconds: u64) -> Result<Row, String> {
    let out = Command::new("wrk")
        .args([
            &format!("-t{WRK_THREADS}"),
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "--latency",
            &format!("http://{addr}/"),
        ])
        .output()
        .map_err(|e| format!("wrk: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text).ok_or_else(|| format!("could not read wrk's output:\n{text}"))
}

fn build(notes: &mut Vec<String>) -> Result<Vec<Server>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    for (pkg, example) in [("fiber", "http_hello"), ("benches", "tokio_http_hello")] {
        let mut cmd = Command::new(&cargo);
        cmd.args(["build", "--release", "-p", pkg, "--example", example]);
        crate::run(&format!("build {example}"), cmd)?;
    }
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_string());
    let mut servers = vec![
        Server {
            name: "fiber",
            program: format!("{target}/release/examples/http_hello"),
            addr_flag: "--addr",
            env: &[],
        },
        // The same server with fiber's default elastic pool (1x to 2x the
        // cores: more threads than the peers get).
        Server {
            name: "fiber, elastic pool (default)",
            program: format!("{target}/release/examples/http_hello"),
            addr_flag: "--addr",
            env: &[],
        },
        // The same server with every socket event left to the poller
        // thread (workers do not take ready events themselves): the two
        // driver designs side by side.
        Server {
            name: "fiber, poller thread only",
            program: format!("{target}/release/examples/http_hello"),
            addr_flag: "--addr",
            env: &[("FIBER_IO_HARVEST", "0")],
        },
        Server {
            name: "tokio",
            program: format!("{target}/release/examples/tokio_http_hello"),
            addr_flag: "--addr",
            env: &[],
        },
    ];
    if have("go", "version") {
        let out = format!("{target}/loadtest/http_hello_go");
        let mut cmd = Command::new("go");
        cmd.args(["build", "-o", &out, "benches/go-http/http_hello.go"]);
        cmd.env("GO111MODULE", "off");
        match crate::run("build the Go server", cmd) {
            Ok(()) => servers.push(Server {
                name: "go",
                program: out,
                addr_flag: "-addr",
                env: &[],
            }),
            Err(e) => notes.push(format!("Go server skipped: {e}")),
        }
    } else {
        notes.push("Go server skipped: `go` is not installed (`apt-get install golang-go`)".into());
    }
    Ok(servers)
}

pub fn run(args: &[&str]) -> Result<(), String> {
    let mut seconds = DEFAULT_SECONDS;
    let mut rounds = 1usize;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match *arg {
            "--duration" => {
                seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&s| s > 0)
                    .ok_or("--duration needs a whole number of seconds")?
            }
            "--rounds" => {
                rounds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&r| r > 0)
                    .ok_or("--rounds needs a whole number above 0")?
            }
            other => return Err(format!("loadtest: unknown argument {other:?}")),
        }
    }
    let mut notes = Vec::new();
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".to_string());
    std::fs::create_dir_all(format!("{target}/loadtest")).map_err(|e| e.to_string())?;
    if !ensure_wrk(&mut notes) {
        for n in &notes {
            eprintln!("loadtest: {n}");
        }
        return Ok(());
    }
    let servers = build(&mut notes)?;
    // results[connections index][server index], the median of `rounds`
    // runs; the servers take turns within each round.
    let mut runs: Vec<Vec<Vec<Row>>> = vec![vec![Vec::new(); servers.len()]; CONNECTIONS.len()];
    let mut failures: Vec<Vec<Option<String>>> = vec![vec![None; servers.len()]; CONNECTIONS.len()];
    for round in 0..rounds {
        for (ci, &c) in CONNECTIONS.iter().enumerate() {
            for (si, server) in servers.iter().enumerate() {
                let addr = free_addr()?;
                let mut child = start(server, addr)?;
                eprintln!(
                    "==> {} at {c} connections for {seconds} s (round {})",
                    server.name,
                    round + 1
                );
                let result = wrk(addr, c, seconds);
                let _ = child.kill();
                let _ = child.wait();
                match result {
                    Ok(r) => {
                        eprintln!(
                            "    {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms {}",
                            r.rps, r.p50_ms, r.p99_ms, r.errors
                        );
                        runs[ci][si].push(r);
                    }
                    Err(e) => failures[ci][si] = Some(e),
                }
            }
        }
    }
    let results: Vec<Vec<Result<Row, String>>> = runs
        .into_iter()
        .zip(failures)
        .map(|(cells, fails)| {
            cells
                .into_iter()
                .zip(fails)
                .map(|(rows, fail)| median_row(rows).ok_or_else(|| fail.unwrap_or_else(|| "no run".to_string())))
                .collect()
        })
        .collect();
    let report = table(&servers, &results, seconds, rounds, &notes);
    println!("\n{report}");
    let path = format!("{target}/loadtest/report.md");
    std::fs::write(&path, &report).map_err(|e| format!("{path}: {e}"))?;
    eprintln!("loadtest: wrote {path}");
    Ok(())
}

/// Each column's median over the runs (requests/s, p50, p99 separately);
/// errors of any run are kept.
fn median_row(mut rows: Vec<Row>) -> Option<Row> {
    if rows.is_empty() {
        return None;
    }
    let mid = rows.len() / 2;
    let median = |rows: &mut Vec<Row>, key: fn(&Row) -> f64| {
        rows.sort_by(|a, b| key(a).total_cmp(&key(b)));
        key(&rows[mid])
    };
    let rps = median(&mut rows, |r| r.rps);
    let p50_ms = median(&mut rows, |r| r.p50_ms);
    let p99_ms = median(&mut rows, |r| r.p99_ms);
    let errors = rows
        .iter()
        .map(|r| r.errors.as_str())
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Some(Row {
        rps,
        p50_ms,
        p99_ms,
        errors,
    })
}

fn table(
    servers: &[Server],
    results: &[Vec<Result<Row, String>>],
    seconds: u64,
    rounds: usize,
    notes: &[String],
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "`cargo xtask loadtest`: wrk -t{WRK_THREADS} --latency, {seconds} s per run, median of {rounds} \
         round(s) (servers take turns within a round), 127.0.0.1, GET / answered with a 13-byte body \
         (keep-alive). Every server has {} worker threads (fiber: FIBER_WORKERS = FIBER_MAX_WORKERS, \
         growth off, except in the elastic row; tokio: its default; Go: GOMAXPROCS's default).\n",
        cores()
    );
    let _ = writeln!(md, "| connections | server | requests/s | p50 | p99 | errors |");
    let _ = writeln!(md, "| ---: | --- | ---: | ---: | ---: | --- |");
    for (ci, &c) in CONNECTIONS.iter().enumerate() {
        for (si, server) in servers.iter().enumerate() {
            match &results[ci][si] {
                Ok(r) => {
                    let _ = writeln!(
                        md,
                        "| {c} | {} | {:.0} | {:.2} ms | {:.2} ms | {} |",
                        server.name,
                        r.rps,
                        r.p50_ms,
                        r.p99_ms,
                        if r.errors.is_empty() { "none" } else { &r.errors }
                    );
                }
                Err(e) => {
                    let _ = writeln!(md, "| {c} | {} | failed | | | {} |", server.name, e.replace('\n', " "));
                }
            }
        }
    }
    for n in notes {
        let _ = writeln!(md, "\nNote: {n}");
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output_is_read() {
        let out = "Running 10s test @ http://127.0.0.1:8080/
  2 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   635.91us  100.00us   5.00ms   90.00%
  Latency Distribution
     50%  612.00us
     75%  700.00us
     90%  1.00ms
     99%    2.50ms
  1000 requests in 10.00s, 100.00KB read
  Socket errors: connect 0, read 3, write 0, timeout 0
Requests/sec:  12345.67
Transfer/sec:     10.00KB
";
        let row = parse_wrk(out).unwrap();
        assert_eq!(row.rps, 12345.67);
        assert!((row.p50_ms - 0.612).abs() < 1e-9);
        assert_eq!(row.p99_ms, 2.5);
        assert_eq!(row.errors, "connect 0, read 3, write 0, timeout 0");
        assert!(parse_wrk("garbage").is_none());
    }
}
