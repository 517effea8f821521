//! Project automation: `cargo xtask ci | loom | bench`.
//!
//! One binary with subcommands; cargo is invoked through the `CARGO`
//! environment variable so the same toolchain runs every step.

use std::env;
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci                      the whole gate: fmt, clippy, tests (spec-assert on), doc tests, rustdoc, loom, 30 s stress,
                          an abort-on-panic run, valgrind (skipped if not installed)
  loom [crate] [filter]   loom models (RUSTFLAGS=--cfg loom), LOOM_MAX_PREEMPTIONS defaults to 2
  stress [--seconds N] [--seed S]  randomized stress mix with invariants checked (spec-assert on)
  valgrind [--seconds N]  the stress mix under valgrind memcheck (invalid accesses, definite leaks)
  bench [--quick] [--fixed-workers] [filter]  the W1-W8 workloads and the job, select and sync rows for fiber, Go, tokio, std threads,
                          one process per measurement, systems interleaved; prints a table and
                          writes target/bench-report/{report.md,ratios.svg}
  bench --criterion [filter]  the criterion micro benches (fiber switch, park + wake)
  loadtest [--duration S] [--rounds N]  http_hello (with and without workers taking I/O) vs tokio (and Go) under wrk at 50 and 1,000 connections
";

/// Default preemption bound for `cargo xtask loom` (loom docs recommend 2-3).
const LOOM_PREEMPTIONS: &str = "2";

/// Crates that hold loom models.
const LOOM_CRATES: &[&str] = &[
    "fiber-core",
    "fiber-sched",
    "fiber-chan",
    "fiber-jobs",
    "fiber-net",
    "fiber-sync",
];

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}

fn run(step: &str, mut cmd: Command) -> Result<(), String> {
    eprintln!("\n==> {step}: {cmd:?}");
    let start = Instant::now();
    let status = cmd.status().map_err(|e| format!("{step}: could not start: {e}"))?;
    eprintln!(
        "==> {step}: {} in {:.1}s",
        if status.success() { "ok" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    if status.success() {
        Ok(())
    } else {
        Err(format!("{step} failed ({status})"))
    }
}

fn ci() -> Result<(), String> {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    run("fmt", fmt)?;

    let mut clippy = cargo();
    clippy.args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]);
    run("clippy", clippy)?;

    let mut test = cargo();
    test.args(["test", "--workspace", "--features", "fiber-core/spec-assert"]);
    run("test (unit, integration and doc tests, spec-assert on)", test)?;

    let mut doc = cargo();
    doc.args(["doc", "--workspace", "--no-deps"])
        .env("RUSTDOCFLAGS", "-D warnings");
    run("doc (rustdoc warnings are errors)", doc)?;

    loom(None, None)?;
    stress(&["--seconds", CI_STRESS_SECONDS])?;
    panic_abort()?;
    valgrind(&["--seconds", "3"])?;
    Ok(())
}

/// Fibers alive at exit under `panic = "abort"`: the process must exit
/// cleanly (their stacks are leaked with a notice, never unwound).
fn panic_abort() -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", "fiber", "--example", "parked_at_exit"])
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_TARGET_DIR", "target/panic-abort")
        .env("FIBER_SHUTDOWN_TIMEOUT_MS", "100");
    run("fibers parked at exit under panic = \"abort\"", cmd)
}

/// The stress mix (with its shutdown rounds) under valgrind's memcheck:
/// any invalid access, use of uninitialised memory or definite leak fails.
/// `--max-stackframe` below the distance between two fiber stacks makes
/// valgrind treat a fiber switch as a stack switch, not a huge frame.
fn valgrind(args: &[&str]) -> Result<(), String> {
    if Command::new("valgrind").arg("--version").output().is_err() {
        eprintln!("\n==> valgrind: skipped (valgrind is not installed; apt-get install valgrind)");
        return Ok(());
    }
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "-p",
        "fiber",
        "--example",
        "stress",
        "--features",
        "fiber-core/spec-assert",
    ]);
    run("build stress for valgrind", build)?;
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--quiet",
        "--error-exitcode=9",
        "--max-stackframe=131072",
        // Valgrind runs one thread at a time; its default hand-over is
        // unfair, and a thread waiting for another in a yield loop could
        // keep the lock for minutes (a 3 s run took 30 s to 6 min in about
        // one run of five). Fair scheduling: 4 s every time.
        "--fair-sched=yes",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite",
        "target/release/examples/stress",
    ]);
    cmd.args(args);
    run("stress under valgrind memcheck", cmd)
}

/// How long `cargo xtask ci` runs the stress mix (30 s keeps the whole
/// gate under 25 minutes on a fresh 2-core machine, where a run with 60 s
/// took 25 minutes; `cargo xtask stress --seconds N` runs it longer).
const CI_STRESS_SECONDS: &str = "30";

fn stress(args: &[&str]) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "-p",
        "fiber",
        "--example",
        "stress",
        "--features",
        "fiber-core/spec-assert",
        "--",
    ]);
    cmd.args(args);
    run("stress", cmd)
}

fn loom(krate: Option<&str>, filter: Option<&str>) -> Result<(), String> {
    let crates: Vec<&str> = match krate {
        Some(k) => vec![k],
        None => LOOM_CRATES.to_vec(),
    };
    for krate in crates {
        let mut cmd = cargo();
        cmd.args(["test", "--release", "-p", krate, "--lib"]);
        if let Some(filter) = filter {
            cmd.arg(filter);
        } else {
            cmd.arg("loom_");
        }
        cmd.env("RUSTFLAGS", "--cfg loom")
            .env("CARGO_TARGET_DIR", "target/loom")
            .env(
                "LOOM_MAX_PREEMPTIONS",
                env::var("LOOM_MAX_PREEMPTIONS").unwrap_or_else(|_| LOOM_PREEMPTIONS.to_string()),
            );
        run(&format!("loom models of {krate}"), cmd)?;
    }
    Ok(())
}

mod bench;
mod loadtest;

fn criterion(filter: Option<&str>) -> Result<(), String> {
    let mut cmd = cargo();
    cmd.args(["bench", "-p", "benches", "--bench", "core_switch"]);
    if let Some(filter) = filter {
        cmd.args(["--", filter]);
    }
    run("criterion benches", cmd)
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let result = match arg(0) {
        Some("ci") => ci(),
        Some("loom") => loom(arg(1), arg(2)),
        Some("stress") => {
            let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
            stress(&rest)
        }
        Some("valgrind") => {
            let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
            valgrind(&rest)
        }
        Some("bench") => {
            let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
            if rest.contains(&"--criterion") {
                criterion(rest.iter().copied().find(|a| !a.starts_with("--")))
            } else {
                bench::run(&rest)
            }
        }
        Some("loadtest") => loadtest::run(&args.iter().skip(1).map(String::as_str).collect::<Vec<_>>()),
        Some("help" | "--help" | "-h") => {
            print!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("unknown or missing command\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
