//! `cargo xtask bench`: every workload for every system, one fresh process
//! per measurement, systems interleaved inside each round; median, min and
//! max; a table on stdout, Markdown and an SVG bar chart of fiber's ratio to
//! the best peer in `target/bench-report/`.
//!
//! Systems: fiber, Go (`benches/go`, built with the local `go` toolchain,
//! standard library only; skipped with a note when `go` is missing), tokio
//! and std threads. Every runtime gets `C` = the number of cores as its
//! worker count (Go: `GOMAXPROCS=C`). fiber starts `C` workers and may grow
//! up to its elastic ceiling, unless `--fixed-workers` pins it to exactly
//! `C` (`workers = max_workers = C`), as the peers are.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// (workload, what it measures, higher is better?)
const WORKLOADS: &[(&str, &str, bool)] = &[
    ("switch", "raw corosensei switch (floor)", false),
    ("w1", "W1 spawn-join", false),
    ("w2", "W2 skynet 1M", false),
    ("w3", "W3 rendezvous ping-pong", false),
    ("w4", "W4 MPMC bounded(1024)", true),
    ("w5", "W5 yield", false),
    ("w6", "W6 100k timers", false),
    ("w7", "W7 memory per parked task", false),
    ("w8", "W8 parallel deflate 64 MiB", true),
    ("job_create", "job creation (spawn + join in a scope)", false),
    ("join_finished", "join of a finished job", false),
    ("scope1k", "scope with 1,000 children", false),
    ("cancel1k", "cancel of a 1,000-child tree", false),
    ("select2", "select over 2 channels", false),
    ("select8", "select over 8 channels", false),
    ("sync_uncontended", "sync: uncontended lock+unlock", false),
    ("sync_contended", "sync: 8 x 100,000 lock/inc/unlock, 2 workers", false),
    ("sync_semaphore", "sync: semaphore acquire/release", false),
    ("sync_waitgroup", "sync: WaitGroup of 1,000", false),
];

const SYSTEMS: &[&str] = &["fiber", "go", "tokio", "threads"];

/// The peers fiber's ratio is taken against.
const PEERS: &[&str] = &["go", "tokio", "threads"];

/// Shown in place of the Go column when there is no `go` on the PATH.
const NO_GO: &str = "go not installed (apt-get install golang-go)";

/// Builds the Go workloads with the local toolchain. `Ok(None)` when `go`
/// is not installed; an error when it is and the build fails. No module
/// is downloaded: the program uses the standard library only.
fn go_binary() -> Result<Option<PathBuf>, String> {
    let installed = Command::new("go")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !installed {
        eprintln!("==> {NO_GO}: the Go column is skipped");
        return Ok(None);
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/go");
    let out_dir = std::env::current_dir()
        .map_err(|e| e.to_string())?
        .join("target/bench-go");
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let binary = out_dir.join("fiberbench");
    eprintln!("==> building the Go workloads");
    let out = Command::new("go")
        .arg("build")
        .arg("-o")
        .arg(&binary)
        .arg(".")
        .current_dir(&source)
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOWORK", "off")
        .output()
        .map_err(|e| format!("go build: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the Go workloads failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Some(binary))
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

#[derive(Default, Clone)]
struct Cell {
    values: Vec<f64>,
    unit: String,
    detail: String,
    skip: Option<String>,
}

fn workload_binary() -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    eprintln!("==> building the workloads (release)");
    let out = Command::new(cargo)
        .args([
            "bench",
            "-p",
            "benches",
            "--bench",
            "workloads",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .map_err(|e| format!("cargo bench: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "building the workloads failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains("\"executable\":\"") && l.contains("workloads"))
        .filter_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let end = l[start..].find('"')? + start;
            Some(l[start..end].to_string())
        })
        .next_back()
        .ok_or_else(|| "no workloads executable in cargo's output".to_string())
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

pub fn run(args: &[&str]) -> Result<(), String> {
    let quick = args.contains(&"--quick");
    let fixed = args.contains(&"--fixed-workers");
    let filter = args.iter().find(|a| !a.starts_with("--")).copied();
    let rounds = if quick { 1 } else { 5 };
    let binary = workload_binary()?;
    let go = go_binary()?;
    let selected: Vec<_> = WORKLOADS
        .iter()
        .filter(|(w, _, _)| filter.is_none_or(|f| w.contains(f)))
        .collect();
    let mut cells: BTreeMap<(String, String), Cell> = BTreeMap::new();
    let total = selected.len() * SYSTEMS.len() * rounds;
    let mut k = 0;
    for round in 0..rounds {
        for (workload, _, _) in &selected {
            for system in SYSTEMS {
                k += 1;
                eprintln!("[{k}/{total}] {workload} / {system} (run {} of {rounds})", round + 1);
                let mut cmd = match (*system, &go) {
                    ("go", None) => {
                        let cell = cells.entry((workload.to_string(), system.to_string())).or_default();
                        cell.skip = Some(NO_GO.to_string());
                        continue;
                    }
                    ("go", Some(go)) => {
                        let mut cmd = Command::new(go);
                        cmd.arg(workload).env("GOMAXPROCS", cores().to_string());
                        cmd
                    }
                    _ => {
                        let mut cmd = Command::new(&binary);
                        cmd.args([workload, system]);
                        if fixed {
                            cmd.arg("--fixed-workers");
                        }
                        cmd
                    }
                };
                let out = cmd
                    .env("ANCHORS_WARMUP", if *workload == "w7" { "0" } else { "1" })
                    .output()
                    .map_err(|e| format!("running {workload}/{system}: {e}"))?;
                let stdout = String::from_utf8_lossy(&out.stdout);
                let stderr = String::from_utf8_lossy(&out.stderr);
                if !out.status.success() {
                    return Err(format!("{workload}/{system} failed ({}):\n{stderr}", out.status));
                }
                let cell = cells.entry((workload.to_string(), system.to_string())).or_default();
                for line in stdout.lines() {
                    let fields: Vec<&str> = line.splitn(6, ' ').collect();
                    match fields.first() {
                        Some(&"RESULT") if fields.len() >= 5 => {
                            let value: f64 = fields[3].parse().map_err(|_| format!("bad value in {line}"))?;
                            cell.values.push(value);
                            cell.unit = fields[4].to_string();
                            cell.detail = fields.get(5).unwrap_or(&"").to_string();
                        }
                        Some(&"SKIP") => cell.skip = Some(line.splitn(4, ' ').nth(3).unwrap_or("").to_string()),
                        _ => {}
                    }
                }
            }
        }
    }
    let report = render(&selected, &cells, quick, fixed);
    println!("{report}");
    std::fs::create_dir_all("target/bench-report").map_err(|e| e.to_string())?;
    std::fs::write("target/bench-report/report.md", &report).map_err(|e| e.to_string())?;
    std::fs::write("target/bench-report/ratios.svg", svg(&selected, &cells)).map_err(|e| e.to_string())?;
    eprintln!("==> wrote target/bench-report/report.md and target/bench-report/ratios.svg");
    Ok(())
}

fn show(cell: Option<&Cell>) -> String {
    match cell {
        Some(c) if c.skip.is_some() => "skip".to_string(),
        Some(c) if !c.values.is_empty() => {
            let min = c.values.iter().cloned().fold(f64::INFINITY, f64::min);
            let max = c.values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let mut s = format!("{:.1}", median(&c.values));
            if c.values.len() > 1 {
                let _ = write!(s, " ({:.1}-{:.1})", min, max);
            }
            if c.detail.starts_with("n=") {
                let _ = write!(s, " {}", c.detail);
            }
            s
        }
        _ => "-".to_string(),
    }
}

/// fiber's ratio to the best peer (>1 means fiber is better).
fn ratio(workload: &str, higher: bool, cells: &BTreeMap<(String, String), Cell>) -> Option<f64> {
    let get = |s: &str| {
        cells
            .get(&(workload.to_string(), s.to_string()))
            .filter(|c| !c.values.is_empty())
            .map(|c| median(&c.values))
    };
    let fiber = get("fiber")?;
    let peers: Vec<f64> = PEERS.iter().filter_map(|s| get(s)).collect();
    let best = if higher {
        peers.iter().cloned().fold(f64::NEG_INFINITY, f64::max)
    } else {
        peers.iter().cloned().fold(f64::INFINITY, f64::min)
    };
    if !best.is_finite() || best == 0.0 || fiber == 0.0 {
        return None;
    }
    Some(if higher { fiber / best } else { best / fiber })
}

fn render(
    selected: &[&(&str, &str, bool)],
    cells: &BTreeMap<(String, String), Cell>,
    quick: bool,
    fixed: bool,
) -> String {
    let mut s = String::new();
    let c = cores();
    let _ = writeln!(
        s,
        "fiber vs peers, {c} core(s), {} (one process per measurement; median (min-max) of the runs; threads = std threads + crossbeam-channel)",
        if quick { "quick: 1 run each" } else { "5 runs each" },
    );
    let _ = writeln!(
        s,
        "Workers: {}; Go GOMAXPROCS={c}; tokio worker_threads({c}).",
        if fixed {
            format!("fiber fixed at {c} (workers = max_workers = {c}, --fixed-workers)")
        } else {
            format!("fiber starts {c}, elastic up to its default ceiling")
        },
    );
    if cells.values().any(|c| c.skip.as_deref() == Some(NO_GO)) {
        let _ = writeln!(s, "Go column skipped: {NO_GO}.");
    }
    let _ = writeln!(s);
    let fiber = if fixed { "fiber (fixed)" } else { "fiber (elastic)" };
    let _ = writeln!(
        s,
        "| workload | unit | {fiber} | go | tokio | threads | fiber vs best peer |"
    );
    let _ = writeln!(s, "| --- | --- | --- | --- | --- | --- | --- |");
    for (workload, name, higher) in selected {
        let cell = |sys: &str| cells.get(&(workload.to_string(), sys.to_string()));
        let unit = SYSTEMS
            .iter()
            .filter_map(|s| cell(s))
            .map(|c| c.unit.clone())
            .find(|u| !u.is_empty())
            .unwrap_or_default();
        let r = ratio(workload, *higher, cells).map_or("-".to_string(), |r| format!("{r:.2}x"));
        let _ = writeln!(
            s,
            "| {name} | {unit}{} | {} | {} | {} | {} | {r} |",
            if *higher { " (higher is better)" } else { "" },
            show(cell("fiber")),
            show(cell("go")),
            show(cell("tokio")),
            show(cell("threads"))
        );
    }
    s
}

fn svg(selected: &[&(&str, &str, bool)], cells: &BTreeMap<(String, String), Cell>) -> String {
    let rows: Vec<(&str, f64)> = selected
        .iter()
        .filter_map(|(w, name, higher)| ratio(w, *higher, cells).map(|r| (*name, r)))
        .collect();
    let height = 40 + rows.len() * 28;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"760\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\\
         <text x=\"10\" y=\"20\" font-size=\"14\">fiber vs best peer (ratio; right of the line = fiber faster)</text>\n"
    );
    let max = rows.iter().map(|r| r.1).fold(2.0f64, f64::max);
    let scale = 420.0 / max;
    let _ = writeln!(
        s,
        "<line x1=\"{x}\" y1=\"30\" x2=\"{x}\" y2=\"{height}\" stroke=\"#888\"/>",
        x = 300.0 + scale
    );
    for (i, (name, r)) in rows.iter().enumerate() {
        let y = 36 + i * 28;
        let color = if *r >= 1.0 { "#3a7" } else { "#c54" };
        let _ = writeln!(s, "<text x=\"10\" y=\"{}\">{}</text>", y + 14, name);
        let _ = writeln!(
            s,
            "<rect x=\"300\" y=\"{y}\" width=\"{:.1}\" height=\"18\" fill=\"{color}\"/><text x=\"{:.1}\" y=\"{}\">{r:.2}x</text>",
            r * scale,
            305.0 + r * scale,
            y + 14
        );
    }
    s.push_str("</svg>\n");
    s
}
