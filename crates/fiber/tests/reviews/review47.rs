//! Review 47: does the project do what its documentation says? Checks of
//! README.md (its code blocks, "Guarantees and caveats", "Cancellation
//! points", "Configuration" and its `FIBER_*` table), the facade's rustdoc
//! (`fiber::Builder`, `fiber::runtime::Builder`, `run`, `spawn`, `sleep`)
//! and the layers' re-exported items (channels, `fiber::sync`,
//! `fiber::net`), from the side of a user coming from std, crossbeam, Go or
//! tokio: boundary values of every variable and builder option (0, 1, the
//! maximum, one past it, garbage, empty, whitespace, case), the error kind
//! and the name in each error, and the behaviour the docs promise.
//! Variables are only ever set in child processes (`child_outcome`).

use crate::common::*;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------
// Configuration: a child process resolves (and, if asked, builds) a
// runtime from its environment and prints the outcome on one line.
// ---------------------------------------------------------------------

const PROBE: &str = "config_probe_child";

/// The child's side: the builder settings come from `R47_BUILDER`
/// (`key=value,..`, keys as the builder's options), `R47_BUILD=1` starts the
/// runtime too.
fn probe_body() {
    let mut b = fiber::Runtime::builder();
    if let Ok(spec) = std::env::var("R47_BUILDER") {
        for kv in spec.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap();
            match k {
                "workers" => b.workers(v.parse().unwrap()),
                "max_workers" => b.max_workers(v.parse().unwrap()),
                "stack_size" => b.stack_size(v.parse().unwrap()),
                "shutdown_ms" => b.shutdown_timeout(ms(v.parse().unwrap())),
                "idle_ms" => b.idle_timeout(ms(v.parse().unwrap())),
                "max_blocking" => b.max_blocking_threads(v.parse().unwrap()),
                "io_harvest" => b.io_harvest(v == "true"),
                "io_park" => b.io_park(v == "true"),
                "thread_name" => b.thread_name(v),
                other => panic!("unknown key {other}"),
            };
        }
    }
    let line = match b.config() {
        Ok(c) => {
            let started = if std::env::var("R47_BUILD").is_ok() {
                let rt = b.build().expect("config() was Ok but build() failed");
                let workers = rt.stats().workers;
                let same = rt.block_on(|| fiber::stats().runtime.workers);
                format!(" started={workers}/{same}")
            } else {
                String::new()
            };
            format!(
                "OK workers={} max={} stack={} idle_ms={} shutdown_ms={} stats={} stall={} abort={} sig={:?} \
                 blocking={} bt={} spans={} harvest={} park={} unguarded={:?}{started}",
                c.workers,
                c.max_workers,
                c.stacks.size,
                c.idle_timeout.as_millis(),
                c.shutdown_timeout.as_millis(),
                c.print_stats,
                c.stall_report,
                c.deadlock_abort,
                c.dump_signal,
                c.max_blocking_threads,
                c.park_backtraces,
                c.fiber_spans,
                c.io_harvest,
                c.io_park,
                c.stacks.unguarded,
            )
        }
        Err(e) => {
            // `build` must say the same, as an `InvalidInput` io::Error.
            let io = b.build().expect_err("config() failed but build() did not");
            assert_eq!(io.kind(), std::io::ErrorKind::InvalidInput, "{io}");
            assert_eq!(io.to_string(), e.to_string());
            format!("ERR setting={} msg={e}", e.setting)
        }
    };
    eprintln!("R47PROBE {line}");
}

#[test]
fn config_probe_child() {
    let _ = child_outcome(PROBE, 30, &[], probe_body);
}

/// Run the probe with `envs` (and `R47_*` settings); its one-line outcome.
fn probe(envs: &[(&str, &str)]) -> String {
    let (status, stderr) = child_outcome(PROBE, 30, envs, probe_body).expect("parent side");
    assert!(
        status.success(),
        "probe child failed ({status:?}) for {envs:?}:\n{stderr}"
    );
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("R47PROBE "))
        .unwrap_or_else(|| panic!("no probe line for {envs:?}:\n{stderr}"))
        .to_string()
}

fn ok_field<'a>(line: &'a str, key: &str) -> &'a str {
    assert!(line.starts_with("OK "), "expected a valid configuration, got: {line}");
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

fn assert_err(line: &str, setting: &str) {
    assert!(
        line.starts_with(&format!("ERR setting={setting} ")),
        "expected an error naming {setting}, got: {line}"
    );
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

// README: the documented defaults, with no variable set.
#[test]
fn the_documented_defaults_hold_with_no_variable_set() {
    let line = probe(&[]);
    let cores = cores().min(1024);
    assert_eq!(ok_field(&line, "workers"), cores.to_string());
    assert_eq!(ok_field(&line, "max"), (2 * cores).min(1024).to_string());
    // 1m in a debug build (this test build has debug assertions).
    let stack = if cfg!(debug_assertions) { 1 << 20 } else { 256 << 10 };
    assert_eq!(ok_field(&line, "stack"), stack.to_string());
    assert_eq!(ok_field(&line, "idle_ms"), "5000");
    assert_eq!(ok_field(&line, "shutdown_ms"), "5000");
    assert_eq!(ok_field(&line, "stats"), "false");
    assert_eq!(ok_field(&line, "stall"), "true");
    assert_eq!(ok_field(&line, "abort"), "false");
    assert_eq!(ok_field(&line, "sig"), "None");
    assert_eq!(ok_field(&line, "blocking"), "512");
    assert_eq!(ok_field(&line, "bt"), "false");
    assert_eq!(ok_field(&line, "spans"), "false");
    assert_eq!(ok_field(&line, "harvest"), "true");
    assert_eq!(ok_field(&line, "park"), "false");
    assert_eq!(ok_field(&line, "unguarded"), "Refuse");
}

// README: FIBER_WORKERS is 1 to 1024; 0, more than the maximum, garbage
// and an empty value are errors naming the variable.
#[test]
fn fiber_workers_boundaries() {
    assert_eq!(ok_field(&probe(&[("FIBER_WORKERS", "1")]), "workers"), "1");
    let line = probe(&[("FIBER_WORKERS", "1024")]);
    assert_eq!(ok_field(&line, "workers"), "1024");
    assert_eq!(ok_field(&line, "max"), "1024");
    for bad in [
        "0",
        "1025",
        "-1",
        "abc",
        "",
        "   ",
        "2.0",
        "1e2",
        "0x10",
        "18446744073709551616",
    ] {
        assert_err(&probe(&[("FIBER_WORKERS", bad)]), "FIBER_WORKERS");
    }
}

// README: "FIBER_MAX_WORKERS ... at least an explicit FIBER_WORKERS; equal
// turns growth off; alone, it lowers the default worker count:
// FIBER_MAX_WORKERS=1 runs one worker".
#[test]
fn fiber_max_workers_alone_lowers_the_workers_and_runs_that_many() {
    let line = probe(&[("FIBER_MAX_WORKERS", "1"), ("R47_BUILD", "1")]);
    assert_eq!(ok_field(&line, "workers"), "1");
    assert_eq!(ok_field(&line, "max"), "1");
    assert_eq!(ok_field(&line, "started"), "1/1");
    let line = probe(&[("FIBER_WORKERS", "2"), ("FIBER_MAX_WORKERS", "2")]);
    assert_eq!((ok_field(&line, "workers"), ok_field(&line, "max")), ("2", "2"));
    assert_err(
        &probe(&[("FIBER_WORKERS", "3"), ("FIBER_MAX_WORKERS", "2")]),
        "FIBER_MAX_WORKERS",
    );
    for bad in ["0", "1025", "", "many"] {
        assert_err(&probe(&[("FIBER_MAX_WORKERS", bad)]), "FIBER_MAX_WORKERS");
    }
    // "2 x cores, and at least the number of workers".
    let line = probe(&[("FIBER_WORKERS", "1000")]);
    assert_eq!(ok_field(&line, "max"), 1000.max((2 * cores()).min(1024)).to_string());
}

// README: FIBER_STACK_SIZE takes k/m/g suffixes, 16k to 1g.
#[test]
fn fiber_stack_size_boundaries_and_suffixes() {
    let size = |v: &str| probe(&[("FIBER_STACK_SIZE", v)]);
    assert_eq!(ok_field(&size("16k"), "stack"), "16384");
    assert_eq!(ok_field(&size("16384"), "stack"), "16384");
    assert_eq!(ok_field(&size("1g"), "stack"), (1u64 << 30).to_string());
    assert_eq!(ok_field(&size("64K"), "stack"), "65536");
    assert_eq!(ok_field(&size("2M"), "stack"), (2u64 << 20).to_string());
    assert_eq!(ok_field(&size("1073741824"), "stack"), (1u64 << 30).to_string());
    for bad in [
        "16383",
        "15k",
        "1073741825",
        "1025m",
        "0",
        "",
        "k",
        "64kb",
        "1.5m",
        "-64k",
        "64x",
        "99999999999999999999g",
    ] {
        assert_err(&size(bad), "FIBER_STACK_SIZE");
    }
}

// README: the two timeouts are whole milliseconds; garbage is an error.
#[test]
fn fiber_timeout_variables_boundaries() {
    for var in ["FIBER_IDLE_TIMEOUT_MS", "FIBER_SHUTDOWN_TIMEOUT_MS"] {
        let key = if var.contains("IDLE") { "idle_ms" } else { "shutdown_ms" };
        assert_eq!(ok_field(&probe(&[(var, "0")]), key), "0");
        assert_eq!(ok_field(&probe(&[(var, "250")]), key), "250");
        assert_eq!(
            ok_field(&probe(&[(var, "18446744073709551615")]), key),
            u64::MAX.to_string()
        );
        for bad in ["-1", "1.5", "5s", "", "abc", "18446744073709551616"] {
            assert_err(&probe(&[(var, bad)]), var);
        }
    }
}

// A runtime whose grace and idle timeouts are the largest the variables
// take starts, runs and drops (an `Instant + timeout` must not overflow).
#[test]
fn the_largest_timeouts_the_variables_take_start_and_drop_a_runtime() {
    let line = probe(&[
        ("FIBER_IDLE_TIMEOUT_MS", "18446744073709551615"),
        ("FIBER_SHUTDOWN_TIMEOUT_MS", "18446744073709551615"),
        ("FIBER_WORKERS", "1"),
        ("FIBER_MAX_WORKERS", "2"),
        ("R47_BUILD", "1"),
    ]);
    assert_eq!(ok_field(&line, "started"), "1/1");
}

// README: "Switches take 1, true, yes or on, and 0, false, no or off
// (lower case)"; an empty value is an error.
#[test]
fn switches_take_the_documented_spellings_only() {
    let switches = [
        ("FIBER_STATS", "stats"),
        ("FIBER_DEBUG_STALL", "stall"),
        ("FIBER_DEADLOCK_ABORT", "abort"),
        ("FIBER_BACKTRACE", "bt"),
        ("FIBER_IO_HARVEST", "harvest"),
        ("FIBER_IO_PARK", "park"),
        ("FIBER_TRACE_SPANS", "spans"),
    ];
    for (var, key) in switches {
        for on in ["1", "true", "yes", "on"] {
            assert_eq!(ok_field(&probe(&[(var, on)]), key), "true", "{var}={on}");
        }
        for off in ["0", "false", "no", "off"] {
            assert_eq!(ok_field(&probe(&[(var, off)]), key), "false", "{var}={off}");
        }
        for bad in ["", "2", "maybe", "y", "enabled"] {
            assert_err(&probe(&[(var, bad)]), var);
        }
    }
}

// README: FIBER_DUMP_SIGNAL takes SIGUSR1/SIGUSR2/USR1/USR2 in any case;
// empty, 0 or off: none; anything else is an error.
#[test]
fn fiber_dump_signal_spellings() {
    let sig = |v: &str| probe(&[("FIBER_DUMP_SIGNAL", v)]);
    for v in ["SIGUSR1", "sigusr1", "Usr1", "usr1"] {
        assert_eq!(ok_field(&sig(v), "sig"), format!("Some({})", libc::SIGUSR1), "{v}");
    }
    for v in ["SIGUSR2", "usr2"] {
        assert_eq!(ok_field(&sig(v), "sig"), format!("Some({})", libc::SIGUSR2), "{v}");
    }
    for v in ["", "0", "off", "OFF"] {
        assert_eq!(ok_field(&sig(v), "sig"), "None", "{v:?}");
    }
    for v in ["SIGINT", "10", "USR3", "SIGUSR", "1"] {
        assert_err(&sig(v), "FIBER_DUMP_SIGNAL");
    }
}

// README: FIBER_UNGUARDED takes `refuse` or `allow`, in any case.
#[test]
fn fiber_unguarded_spellings() {
    assert_eq!(ok_field(&probe(&[("FIBER_UNGUARDED", "ALLOW")]), "unguarded"), "Allow");
    assert_eq!(
        ok_field(&probe(&[("FIBER_UNGUARDED", "Refuse")]), "unguarded"),
        "Refuse"
    );
    for bad in ["", "yes", "1", "allowed"] {
        assert_err(&probe(&[("FIBER_UNGUARDED", bad)]), "FIBER_UNGUARDED");
    }
}

// README: FIBER_MAX_BLOCKING is 1 to 65536.
#[test]
fn fiber_max_blocking_boundaries() {
    assert_eq!(ok_field(&probe(&[("FIBER_MAX_BLOCKING", "1")]), "blocking"), "1");
    assert_eq!(
        ok_field(&probe(&[("FIBER_MAX_BLOCKING", "65536")]), "blocking"),
        "65536"
    );
    for bad in ["0", "65537", "", "-3", "lots"] {
        assert_err(&probe(&[("FIBER_MAX_BLOCKING", bad)]), "FIBER_MAX_BLOCKING");
    }
}

// README: "FIBER_IO_PARK=1 with FIBER_IO_HARVEST=0" is an error; a builder
// value that settles the contradiction wins.
#[test]
fn io_park_without_harvest_is_refused_and_the_builder_can_settle_it() {
    let line = probe(&[("FIBER_IO_PARK", "1"), ("FIBER_IO_HARVEST", "0")]);
    assert_err(&line, "FIBER_IO_PARK");
    assert!(line.contains("FIBER_IO_HARVEST"), "{line}");
    let line = probe(&[
        ("FIBER_IO_PARK", "1"),
        ("FIBER_IO_HARVEST", "0"),
        ("R47_BUILDER", "io_harvest=true"),
    ]);
    assert_eq!(ok_field(&line, "park"), "true");
    let line = probe(&[("R47_BUILDER", "io_harvest=false,io_park=true")]);
    assert_err(&line, "io_park");
}

// README: "Builder values win over the environment; a variable that is set
// is still checked, so a malformed one is an error even where the builder
// sets that value".
#[test]
fn builder_values_win_but_a_malformed_variable_is_still_an_error() {
    let line = probe(&[("FIBER_WORKERS", "7"), ("R47_BUILDER", "workers=2,max_workers=2")]);
    assert_eq!((ok_field(&line, "workers"), ok_field(&line, "max")), ("2", "2"));
    let line = probe(&[("FIBER_SHUTDOWN_TIMEOUT_MS", "9"), ("R47_BUILDER", "shutdown_ms=40")]);
    assert_eq!(ok_field(&line, "shutdown_ms"), "40");
    let line = probe(&[("FIBER_MAX_BLOCKING", "9"), ("R47_BUILDER", "max_blocking=3")]);
    assert_eq!(ok_field(&line, "blocking"), "3");
    let cases = [
        ("FIBER_WORKERS", "abc", "workers=2"),
        ("FIBER_MAX_WORKERS", "0", "max_workers=4"),
        ("FIBER_STACK_SIZE", "huge", "stack_size=65536"),
        ("FIBER_IDLE_TIMEOUT_MS", "soon", "idle_ms=10"),
        ("FIBER_SHUTDOWN_TIMEOUT_MS", "-1", "shutdown_ms=10"),
        ("FIBER_MAX_BLOCKING", "0", "max_blocking=4"),
        ("FIBER_IO_HARVEST", "", "io_harvest=true"),
        ("FIBER_IO_PARK", "maybe", "io_park=false"),
    ];
    for (var, value, builder) in cases {
        assert_err(&probe(&[(var, value), ("R47_BUILDER", builder)]), var);
    }
}

// runtime::Builder: out-of-range options are `InvalidInput` errors naming
// the option (checked in the probe: `build` agrees with `config`).
#[test]
fn builder_options_out_of_range_name_the_option() {
    let cases = [
        ("workers=0", "workers"),
        ("workers=1025,max_workers=1025", "workers"),
        ("max_workers=1025", "max_workers"),
        ("workers=4,max_workers=3", "max_workers"),
        ("stack_size=16383", "stack_size"),
        ("stack_size=1073741825", "stack_size"),
        ("max_blocking=0", "max_blocking_threads"),
        ("max_blocking=65537", "max_blocking_threads"),
    ];
    for (builder, setting) in cases {
        assert_err(&probe(&[("R47_BUILDER", builder)]), setting);
    }
    let line = probe(&[(
        "R47_BUILDER",
        "stack_size=16384,max_blocking=65536,workers=1024,max_workers=1024",
    )]);
    assert_eq!(ok_field(&line, "stack"), "16384");
}

// `fiber::run` with a bad variable panics naming it (its rustdoc).
#[test]
fn run_with_a_bad_variable_panics_naming_it() {
    let Some((status, stderr)) = child_outcome(
        "run_with_a_bad_variable_panics_naming_it",
        30,
        &[("FIBER_STACK_SIZE", "12")],
        || {
            let msg = panic_message(|| fiber::run(|| ())).expect("run did not panic");
            assert!(msg.contains("FIBER_STACK_SIZE"), "{msg}");
            assert!(msg.contains("cannot start the runtime"), "{msg}");
        },
    ) else {
        return;
    };
    assert!(status.success(), "{stderr}");
}

// ---------------------------------------------------------------------
// README code blocks, run as tests.
// ---------------------------------------------------------------------

// The README's first example: 10,000 fibers on a rendezvous channel.
#[test]
fn readme_first_example_sums_ten_thousand_fibers() {
    let total = within(30, || {
        fiber::run(|| {
            let (tx, rx) = fiber::chan::bounded(0);
            for i in 0..10_000u64 {
                let tx = tx.clone();
                fiber::spawn(move || tx.send(i).unwrap());
            }
            drop(tx);
            let sum = fiber::with_timeout(Duration::from_secs(5), || rx.iter().sum::<u64>());
            sum.expect("finished in time")
        })
    });
    assert_eq!(total, 49_995_000);
}

// The README's "Tracing" block (a global subscriber: in a child process).
#[test]
fn readme_tracing_example_runs() {
    in_child("readme_tracing_example_runs", 30, || {
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::sink)
            .init();
        let v = fiber::run(|| fiber::scope(|s| s.spawn(|| 42).join().unwrap()));
        assert_eq!(v, 42);
    });
}

// The README's per-fiber span block: the event is logged inside a span
// named `fiber` whose `name` field is the fiber's name.
#[test]
fn readme_fiber_spans_example_logs_inside_the_named_span() {
    in_child("readme_fiber_spans_example_logs_inside_the_named_span", 30, || {
        #[derive(Clone, Default)]
        struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || out.clone())
            .init();
        let rt = fiber::Runtime::builder().fiber_spans(true).build().unwrap();
        rt.block_on(|| {
            fiber::Builder::new()
                .name("conn-42")
                .spawn(|| tracing::info!("handled"))
                .unwrap()
                .join()
                .unwrap();
        });
        drop(rt);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let line = text.lines().find(|l| l.contains("handled")).expect(&text);
        assert!(line.contains("fiber{") && line.contains("name=\"conn-42\""), "{line}");
    });
}

// fiber::Builder's rustdoc examples.
#[test]
fn builder_rustdoc_examples_run() {
    on_runtime(|| {
        let handle = fiber::Builder::new()
            .name("conn-42")
            .stack_size(64 * 1024)
            .spawn(|| fiber::current().name().map(str::to_owned))
            .unwrap();
        assert_eq!(handle.join().unwrap().as_deref(), Some("conn-42"));
        let deep = fiber::Builder::new()
            .stack_size(8 << 20)
            .spawn(|| {
                fn depth(n: u64) -> u64 {
                    let pad = std::hint::black_box([0u8; 512]);
                    if n == 0 {
                        pad[0] as u64
                    } else {
                        1 + depth(n - 1)
                    }
                }
                depth(4_000)
            })
            .unwrap();
        assert_eq!(deep.join().unwrap(), 4_000);
        let mut hits = 0;
        fiber::scope(|s| {
            fiber::Builder::new()
                .name("counter")
                .spawn_scoped(s, || hits += 1)
                .unwrap();
        });
        assert_eq!(hits, 1);
    });
}

// ---------------------------------------------------------------------
// fiber::Builder (per-fiber settings).
// ---------------------------------------------------------------------

// Rustdoc: "Above 1 GiB the spawn fails with io::ErrorKind::InvalidInput",
// also at the very top of the range (no overflow while rounding to pages).
#[test]
fn builder_stack_size_above_one_gib_is_invalid_input_up_to_usize_max() {
    on_runtime(|| {
        for size in [(1usize << 30) + 1, usize::MAX / 2, usize::MAX - 4095, usize::MAX] {
            let err = fiber::Builder::new().stack_size(size).spawn(|| ()).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{size}: {err}");
        }
        // The same through a scope.
        fiber::scope(|s| {
            let err = fiber::Builder::new()
                .stack_size(usize::MAX)
                .spawn_scoped(s, || ())
                .unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
        });
    });
}

// Rustdoc: a stack size at or below the runtime's uses the pool's stack:
// zero and one byte are fine.
#[test]
fn builder_tiny_stack_sizes_use_the_pool_stack() {
    on_runtime(|| {
        for size in [0, 1, 4096] {
            let h = fiber::Builder::new().stack_size(size).spawn(move || size).unwrap();
            assert_eq!(h.join().unwrap(), size);
        }
    });
}

// Rustdoc: a name with a NUL byte panics as std's Builder does.
#[test]
fn builder_name_with_nul_panics_like_std() {
    on_runtime(|| {
        let msg = panic_message(|| {
            let _ = fiber::Builder::new().name("a\0b").spawn(|| ());
        })
        .expect("no panic");
        assert_eq!(msg, "fiber name may not contain interior null bytes");
    });
}

// Rustdoc: `Builder::spawn` outside a fiber panics naming it.
#[test]
fn builder_spawn_outside_a_fiber_names_the_function() {
    let msg = panic_message(|| {
        let _ = fiber::Builder::new().spawn(|| ());
    })
    .expect("no panic");
    assert!(msg.contains("fiber::Builder::spawn called outside a fiber"), "{msg}");
}

// A named fiber's panic: JoinError names the fiber (facade spec).
#[test]
fn a_named_fibers_panic_names_it_in_the_join_error() {
    on_runtime(|| {
        let h = fiber::Builder::new()
            .name("worker-7")
            .spawn(|| -> () { std::panic::panic_any(7u32) })
            .unwrap();
        let e = h.join().unwrap_err();
        assert!(e.is_panic());
        assert_eq!(e.name(), Some("worker-7"));
        assert!(e.to_string().contains("worker-7"), "{e}");
        // As std's: a payload that is not a string is lent too when its
        // type is `Sync` (`JoinError::downcast_ref`'s rustdoc).
        assert_eq!(e.downcast_ref::<u32>(), Some(&7));
        assert_eq!(*e.into_panic().downcast::<u32>().unwrap(), 7);
    });
}

// ---------------------------------------------------------------------
// runtime::Builder options.
// ---------------------------------------------------------------------

// "Name prefix of the runtime's threads" (`<name>-<index>`).
#[test]
fn thread_name_prefixes_the_worker_threads() {
    let rt = fiber::Runtime::builder()
        .workers(1)
        .max_workers(1)
        .thread_name("r47pool")
        .shutdown_timeout(ms(200))
        .build()
        .unwrap();
    let name = within(10, move || {
        rt.block_on(|| std::thread::current().name().map(str::to_owned))
    });
    assert_eq!(name.as_deref(), Some("r47pool-0"));
}

// A NUL in a thread name is an InvalidInput error naming thread_name.
#[test]
fn thread_name_with_nul_is_invalid_input() {
    let err = fiber::Runtime::builder().thread_name("a\0b").build().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("thread_name"), "{err}");
}

// README: `Runtime::with_config` refuses a dump_signal other than
// SIGUSR1/SIGUSR2, and every other invalid field, as InvalidInput.
#[test]
fn with_config_validates_every_field() {
    let base = || fiber::Runtime::builder().workers(1).max_workers(1).config().unwrap();
    let mut c = base();
    c.dump_signal = Some(libc::SIGINT);
    let e = fiber::Runtime::with_config(c).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("dump_signal"), "{e}");
    let mut c = base();
    c.workers = 0;
    assert_eq!(
        fiber::Runtime::with_config(c).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
    let mut c = base();
    c.max_blocking_threads = 0;
    assert_eq!(
        fiber::Runtime::with_config(c).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
    let mut c = base();
    c.io_harvest = false;
    c.io_park = true;
    assert_eq!(
        fiber::Runtime::with_config(c).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
    let mut c = base();
    c.stacks.size = 1;
    assert_eq!(
        fiber::Runtime::with_config(c).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
}

// `Duration::MAX` as the idle and shutdown timeouts: documented as
// "waits forever"; a runtime with them runs, and drops at once when
// nothing is alive.
#[test]
fn duration_max_timeouts_are_accepted_and_a_quiet_runtime_drops_at_once() {
    within(10, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(Duration::MAX)
            .shutdown_timeout(Duration::MAX)
            .build()
            .unwrap();
        assert_eq!(rt.block_on(|| 5), 5);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(2));
    });
}

// on_thread_start / on_thread_stop run on every worker.
#[test]
fn thread_hooks_run_once_per_worker() {
    let started = Arc::new(AtomicUsize::new(0));
    let stopped = Arc::new(AtomicUsize::new(0));
    let (s1, s2) = (started.clone(), stopped.clone());
    let rt = fiber::Runtime::builder()
        .workers(2)
        .max_workers(2)
        .on_thread_start(move || {
            s1.fetch_add(1, Ordering::SeqCst);
        })
        .on_thread_stop(move || {
            s2.fetch_add(1, Ordering::SeqCst);
        })
        .shutdown_timeout(ms(200))
        .build()
        .unwrap();
    assert_eq!(started.load(Ordering::SeqCst), 2);
    within(10, move || drop(rt));
    assert_eq!(stopped.load(Ordering::SeqCst), 2);
}

// ---------------------------------------------------------------------
// README "Guarantees and caveats": the operation budget for operations
// that succeed at once ("every 128 channel, select, socket, lock,
// semaphore, join, scope, barrier, wait group and park calls in a row
// that do not switch away, one yields first").
// ---------------------------------------------------------------------

static UNCONTENDED: fiber::sync::Mutex<u64> = fiber::sync::Mutex::new(0);
static RW: fiber::sync::RwLock<u64> = fiber::sync::RwLock::new(0);
static SEM: std::sync::LazyLock<fiber::sync::Semaphore> = std::sync::LazyLock::new(|| fiber::sync::Semaphore::new(1));
static BARRIER1: fiber::sync::Barrier = fiber::sync::Barrier::new(1);

#[test]
fn a_loop_on_an_uncontended_mutex_lets_others_run() {
    poller_lets_others_run(|| *UNCONTENDED.lock().unwrap() += 1);
}

#[test]
fn a_loop_on_uncontended_rwlock_reads_and_writes_lets_others_run() {
    poller_lets_others_run(|| {
        let _ = *RW.read().unwrap();
    });
    poller_lets_others_run(|| *RW.write().unwrap() += 1);
}

#[test]
fn a_loop_on_a_free_semaphore_lets_others_run() {
    poller_lets_others_run(|| drop(SEM.acquire().unwrap()));
}

#[test]
fn a_loop_on_a_barrier_of_one_lets_others_run() {
    poller_lets_others_run(|| assert!(BARRIER1.wait().is_leader()));
}

#[test]
fn a_loop_on_a_lone_wait_group_lets_others_run() {
    poller_lets_others_run(|| fiber::sync::WaitGroup::new().wait());
}

#[test]
fn a_loop_on_park_with_a_token_lets_others_run() {
    poller_lets_others_run(|| {
        fiber::current().unpark();
        fiber::park();
    });
}

#[test]
fn a_loop_on_empty_scopes_lets_others_run() {
    poller_lets_others_run(|| fiber::scope(|_| ()));
}

#[test]
fn a_loop_on_a_finished_jobs_join_lets_others_run() {
    poller_lets_others_run(|| {
        let _ = fiber::Job::current().is_active();
        let _ = fiber::try_scope(|_| Ok::<(), ()>(()));
    });
}

// README: failing non-blocking calls count toward the poll budget (a
// failed try_lock, try_read, try_write, try_acquire).
static HELD: fiber::sync::Mutex<()> = fiber::sync::Mutex::new(());
static HELD_RW: fiber::sync::RwLock<()> = fiber::sync::RwLock::new(());
static HOLD: std::sync::Once = std::sync::Once::new();
static EMPTY_SEM: std::sync::LazyLock<fiber::sync::Semaphore> =
    std::sync::LazyLock::new(|| fiber::sync::Semaphore::new(0));

fn hold_locks() {
    HOLD.call_once(|| {
        // Plain threads hold them for ever.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _g = HELD.lock().unwrap();
            let _w = HELD_RW.write().unwrap();
            tx.send(()).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap();
    });
}

#[test]
fn failed_try_lock_try_read_try_write_try_acquire_loops_let_others_run() {
    hold_locks();
    poller_lets_others_run(|| assert!(HELD.try_lock().is_err()));
    poller_lets_others_run(|| assert!(HELD_RW.try_read().is_err()));
    poller_lets_others_run(|| assert!(HELD_RW.try_write().is_err()));
    poller_lets_others_run(|| assert!(EMPTY_SEM.try_acquire().is_none()));
}

// ---------------------------------------------------------------------
// README "Cancellation points".
// ---------------------------------------------------------------------

/// Spawn `body` on the current runtime, wait until it has parked, cancel
/// it, and return what it returned (its join says `Cancelled` whatever the
/// body returned: spec/jobs.md, so the value comes back another way).
fn cancelled_while<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> T {
    let started = Arc::new(AtomicBool::new(false));
    let out = Arc::new(std::sync::Mutex::new(None));
    let (s, o) = (started.clone(), out.clone());
    let h = fiber::spawn(move || {
        s.store(true, Ordering::SeqCst);
        let v = body();
        *o.lock().unwrap() = Some(v);
    });
    wait_until("the fiber to start", 10, || started.load(Ordering::SeqCst));
    wait_fiber_parked(h.id());
    h.cancel();
    assert!(h.join().unwrap_err().is_cancelled());
    let v = out.lock().unwrap().take();
    v.expect("the body did not return")
}

#[test]
fn sleep_sleep_until_and_yield_now_return_cancelled() {
    on_runtime(|| {
        assert!(cancelled_while(|| fiber::sleep(Duration::from_secs(30))).is_err());
        assert!(cancelled_while(|| fiber::sleep_until(Instant::now() + Duration::from_secs(30))).is_err());
        assert!(cancelled_while(|| fiber::sleep(Duration::MAX)).is_err());
        // yield_now in a cancelled fiber.
        let r = cancelled_while(|| {
            let _ = fiber::sleep(Duration::from_secs(30));
            (fiber::yield_now(), fiber::check_cancelled(), fiber::is_cancelled())
        });
        assert!(r.0.is_err() && r.1.is_err() && r.2);
    });
}

// "a cancelled `send` gives its value back in the error".
#[test]
fn a_cancelled_send_gives_its_value_back() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<String>(0);
        let r = cancelled_while(move || tx.send("kept".to_string()));
        assert_eq!(r.unwrap_err().into_inner(), "kept");
        assert!(rx.try_recv().is_err(), "nothing was sent");
        let (tx, _rx) = fiber::chan::bounded::<Vec<u8>>(1);
        tx.send(vec![1]).unwrap();
        let r = cancelled_while(move || tx.send_timeout(vec![2], Duration::from_secs(30)));
        assert_eq!(r.unwrap_err().into_inner(), vec![2]);
    });
}

// "a cancelled select runs its first channel arm with a failed result;
// the timed forms report a timeout".
#[test]
fn a_cancelled_select_runs_its_first_arm_failed_and_a_timed_one_times_out() {
    on_runtime(|| {
        let (_t1, r1) = fiber::chan::unbounded::<u8>();
        let (_t2, r2) = fiber::chan::unbounded::<u8>();
        let arm = cancelled_while(move || {
            fiber::select! {
                recv(r1) -> m => ("first", m.is_err()),
                recv(r2) -> m => ("second", m.is_err()),
            }
        });
        assert_eq!(arm, ("first", true));
        let (_t1, r1) = fiber::chan::unbounded::<u8>();
        let arm = cancelled_while(move || {
            fiber::select! {
                recv(r1) -> _m => "recv",
                default(Duration::from_secs(30)) => "timeout",
            }
        });
        assert_eq!(arm, "timeout");
    });
}

// "fiber::park / park_timeout (return without parking)".
#[test]
fn park_in_a_cancelled_fiber_returns_without_parking() {
    on_runtime(|| {
        let t = cancelled_while(|| {
            let _ = fiber::sleep(Duration::from_secs(30));
            let t = Instant::now();
            fiber::park();
            fiber::park_timeout(Duration::from_secs(30));
            t.elapsed()
        });
        assert!(t < Duration::from_secs(5), "{t:?}");
    });
}

// "fiber::sync: Semaphore::acquire, Condvar waits, Barrier::wait,
// WaitGroup::wait (not Mutex::lock or RwLock, as in std)".
#[test]
fn sync_cancellation_points_are_the_documented_ones() {
    on_runtime(|| {
        let sem = Arc::new(fiber::sync::Semaphore::new(0));
        let s = sem.clone();
        assert!(cancelled_while(move || s.acquire().map(|p| p.num_permits())).is_err());
        assert_eq!(sem.available_permits(), 0);

        let pair = Arc::new((fiber::sync::Mutex::new(false), fiber::sync::Condvar::new()));
        let p = pair.clone();
        let waited = cancelled_while(move || {
            let (m, c) = &*p;
            let g = m.lock().unwrap();
            let g = c.wait(g).unwrap();
            !*g
        });
        assert!(waited, "the condvar wait returned early with the flag unset");

        let barrier = Arc::new(fiber::sync::Barrier::new(2));
        let b = barrier.clone();
        assert!(cancelled_while(move || b.wait().is_cancelled()));

        let wg = fiber::sync::WaitGroup::new();
        let member = wg.clone();
        cancelled_while(move || wg.wait());
        drop(member);

        // Mutex::lock is not a cancellation point: the cancelled fiber still
        // gets the lock once it is free.
        let m = Arc::new(fiber::sync::Mutex::new(0));
        let guard = m.lock().unwrap();
        let m2 = m.clone();
        let h = fiber::spawn(move || {
            *m2.lock().unwrap() += 1;
            fiber::is_cancelled()
        });
        wait_fiber_parked(h.id());
        h.cancel();
        fiber::sleep(ms(20)).unwrap();
        drop(guard);
        assert!(h.join().unwrap_err().is_cancelled());
        assert_eq!(*m.lock().unwrap(), 1, "the cancelled fiber took the lock");
    });
}

// "Job::join checks even a job that has already ended, as Kotlin's join,
// while a finished fiber's handle still gives its result".
#[test]
fn a_cancelled_fiber_joining_a_finished_fiber_gets_its_value_but_job_join_is_cancelled() {
    on_runtime(|| {
        let done = fiber::spawn(|| 11);
        while !done.is_finished() {
            fiber::yield_now().unwrap();
        }
        let (v, job) = cancelled_while(move || {
            let _ = fiber::sleep(Duration::from_secs(30));
            let job_join = fiber::scope(|s| {
                let job = s.job();
                drop(job);
                fiber::Job::current().join()
            });
            (done.join().ok(), job_join.is_err())
        });
        assert_eq!(v, Some(11));
        assert!(job);
    });
}

// "non_cancellable: there the cancellation is held off (a with_timeout
// opened inside still times out) and it is seen again after".
#[test]
fn non_cancellable_holds_off_cancel_but_an_inner_with_timeout_still_fires() {
    on_runtime(|| {
        let r = cancelled_while(|| {
            let _ = fiber::sleep(Duration::from_secs(30));
            let inner = fiber::non_cancellable(|| {
                let slept = fiber::sleep(ms(5)).is_ok();
                let timed = fiber::with_timeout(ms(20), || fiber::sleep(Duration::from_secs(30)));
                (slept, timed.is_err(), fiber::is_cancelled())
            });
            (inner, fiber::is_cancelled())
        });
        assert_eq!(r, ((true, true, false), true));
    });
}

// ---------------------------------------------------------------------
// README "Shutdown".
// ---------------------------------------------------------------------

// "a channel operation or park inside fiber::non_cancellable keeps the
// whole grace time (a thread may send the last message)": the message a
// plain thread sends during the grace time is received, not lost.
#[test]
fn a_non_cancellable_recv_gets_a_message_a_thread_sends_during_the_grace_time() {
    within(20, || {
        let rt = rt_grace(2, Duration::from_secs(5));
        let (tx, rx) = fiber::chan::bounded::<u32>(0);
        let got = Arc::new(AtomicUsize::new(0));
        let g = got.clone();
        let h = rt.spawn(move || {
            fiber::non_cancellable(|| {
                if let Ok(v) = rx.recv() {
                    g.store(v as usize, Ordering::SeqCst);
                }
            })
        });
        drop(h);
        wait_parked(&rt, 1);
        let sender = std::thread::spawn(move || {
            std::thread::sleep(ms(200));
            tx.send(47).is_ok()
        });
        let t = Instant::now();
        drop(rt);
        assert!(sender.join().unwrap(), "the thread's send failed");
        assert_eq!(got.load(Ordering::SeqCst), 47, "the message was lost");
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    });
}

// "The wait ends early once every live fiber has been parked for 50 ms on
// something only another fiber could end".
#[test]
fn shutdown_ends_early_when_every_fiber_waits_on_another_fiber() {
    within(20, || {
        let rt = rt_grace(2, Duration::from_secs(10));
        // Two fibers that join each other, where cancellation is held off:
        // only the other fiber could end either wait.
        let (to_a, from_main_a) = fiber::chan::bounded::<fiber::JoinHandle<()>>(1);
        let (to_b, from_main_b) = fiber::chan::bounded::<fiber::JoinHandle<()>>(1);
        let a = rt.spawn(move || {
            let b = from_main_a.recv().unwrap();
            let _ = fiber::non_cancellable(|| b.join());
        });
        let b = rt.spawn(move || {
            let a = from_main_b.recv().unwrap();
            let _ = fiber::non_cancellable(|| a.join());
        });
        to_a.send(b).unwrap();
        to_b.send(a).unwrap();
        wait_parked(&rt, 2);
        let t = Instant::now();
        drop(rt);
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    });
}

// "Dropping a Runtime inside one of its own fibers" is refused with a
// panic (and no thread leaks).
#[test]
fn dropping_a_runtime_from_its_own_fiber_panics_with_advice() {
    within(20, || {
        let rt = Arc::new(std::sync::Mutex::new(Some(rt_grace(1, ms(200)))));
        let r = rt.clone();
        let h = rt.lock().unwrap().as_ref().unwrap().handle();
        let (tx, rx) = std::sync::mpsc::channel();
        drop(h.spawn(move || {
            let own = r.lock().unwrap().take().unwrap();
            tx.send(panic_message(move || drop(own))).unwrap();
        }));
        let msg = rx.recv().unwrap().expect("no panic");
        assert!(msg.contains("cannot wait for itself"), "{msg}");
    });
}

// ---------------------------------------------------------------------
// "Blocking calls": the pool's cap.
// ---------------------------------------------------------------------

// `max_blocking_threads(1)`: two blocking calls at once run one after the
// other, never together.
#[test]
fn max_blocking_threads_one_runs_calls_one_at_a_time() {
    within(20, || {
        let rt = fiber::Runtime::builder()
            .workers(2)
            .max_blocking_threads(1)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let inside = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        rt.block_on(|| {
            fiber::scope(|s| {
                for _ in 0..3 {
                    let (inside, most) = (inside.clone(), most.clone());
                    s.spawn(move || {
                        fiber::blocking(|| {
                            let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(n, Ordering::SeqCst);
                            std::thread::sleep(ms(50));
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                    });
                }
            });
        });
        assert_eq!(most.load(Ordering::SeqCst), 1);
    });
}

// `blocking` re-raises `f`'s panic with its payload; outside a runtime it
// just calls `f`.
#[test]
fn blocking_reraises_the_panic_and_runs_inline_outside_a_runtime() {
    assert_eq!(fiber::blocking(|| 3), 3);
    on_runtime(|| {
        let msg = panic_message(|| fiber::blocking(|| panic!("in the pool"))).unwrap();
        assert_eq!(msg, "in the pool");
        // The fiber goes on.
        assert_eq!(fiber::blocking(|| 4), 4);
    });
}

// ---------------------------------------------------------------------
// Channels (crossbeam's API) and timers.
// ---------------------------------------------------------------------

// crossbeam: a zero-capacity channel is both empty and full, capacity
// Some(0); unbounded has capacity None and is never full.
#[test]
fn channel_capacity_len_and_fullness_match_crossbeam() {
    let (tx, rx) = fiber::chan::bounded::<u8>(0);
    assert_eq!((tx.capacity(), rx.capacity()), (Some(0), Some(0)));
    assert!(tx.is_empty() && tx.is_full() && rx.is_empty() && rx.is_full());
    assert_eq!(tx.len(), 0);
    let (tx, rx) = fiber::chan::unbounded::<u8>();
    assert_eq!(tx.capacity(), None);
    for i in 0..100 {
        tx.send(i).unwrap();
    }
    assert!(!tx.is_full());
    assert_eq!(rx.len(), 100);
    let (tx, rx) = fiber::chan::bounded::<u8>(2);
    tx.send(1).unwrap();
    tx.send(2).unwrap();
    assert!(tx.is_full() && rx.is_full());
    assert!(matches!(tx.try_send(3), Err(fiber::chan::TrySendError::Full(3))));
    drop(rx);
    assert!(matches!(
        tx.try_send(4),
        Err(fiber::chan::TrySendError::Disconnected(4))
    ));
}

// crossbeam: the buffer drains after the senders leave, then Disconnected.
#[test]
fn receivers_drain_the_buffer_after_every_sender_left() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded(4);
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        drop(tx);
        assert_eq!(rx.recv(), Ok(1));
        assert_eq!(rx.recv_timeout(ms(10)), Ok(2));
        assert_eq!(
            rx.recv_timeout(ms(10)),
            Err(fiber::chan::RecvTimeoutError::Disconnected)
        );
        assert_eq!(rx.try_recv(), Err(fiber::chan::TryRecvError::Disconnected));
        assert_eq!(rx.recv(), Err(fiber::chan::RecvError));
    });
}

// `close` (Go's close): buffered values and parked senders' values are
// still delivered; later sends fail with their value; a second close
// returns false.
#[test]
fn close_delivers_what_was_sent_and_refuses_later_sends() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded(1);
        tx.send(1).unwrap();
        let t2 = tx.clone();
        let parked = fiber::spawn(move || t2.send(2));
        wait_fiber_parked(parked.id());
        assert!(rx.close());
        assert!(!tx.close());
        assert!(tx.is_closed() && rx.is_closed());
        assert_eq!(tx.send(3).unwrap_err().into_inner(), 3);
        let mut got = vec![rx.recv().unwrap()];
        got.extend(rx.recv().ok());
        assert_eq!(got, vec![1, 2]);
        assert!(parked.join().unwrap().is_ok());
        assert!(rx.recv().is_err());
    });
}

// Timers with extreme durations: `after(Duration::MAX)` and
// `tick(Duration::MAX)` never fire (and do not panic); `after(ZERO)` is
// ready at once; `at` in the past delivers its instant.
#[test]
fn timer_channels_at_the_extremes() {
    on_runtime(|| {
        let never = fiber::chan::after(Duration::MAX);
        assert!(never.recv_timeout(ms(20)).is_err());
        let never_tick = fiber::chan::tick(Duration::MAX);
        assert!(never_tick.try_recv().is_err());
        let now = fiber::chan::after(Duration::ZERO);
        assert!(now.recv_timeout(ms(500)).is_ok());
        let past = Instant::now() - ms(100);
        assert_eq!(fiber::chan::at(past).recv().unwrap(), past);
        let ticks = fiber::chan::tick(ms(5));
        let a = ticks.recv().unwrap();
        let b = ticks.recv().unwrap();
        assert!(b > a);
        assert!(fiber::chan::never::<u8>().recv_timeout(ms(10)).is_err());
    });
}

// crossbeam: recv_timeout / send_timeout with Duration::MAX wait (no panic).
#[test]
fn duration_max_timeouts_wait_instead_of_panicking() {
    on_runtime(|| {
        let (tx, rx) = fiber::chan::bounded::<u8>(0);
        let h = fiber::spawn(move || rx.recv_timeout(Duration::MAX));
        fiber::sleep(ms(20)).unwrap();
        tx.send_timeout(9, Duration::MAX).unwrap();
        assert_eq!(h.join().unwrap(), Ok(9));
        assert!(fiber::with_timeout(Duration::MAX, || 1).is_ok());
    });
}

// A bounded(1) channel on plain threads works as crossbeam's does (README:
// "for fibers and threads").
#[test]
fn channels_work_between_plain_threads_and_fibers() {
    within(20, || {
        let (tx, rx) = fiber::chan::bounded::<u32>(1);
        let producer = std::thread::spawn(move || {
            for i in 0..1000 {
                tx.send(i).unwrap();
            }
        });
        let sum = rt().block_on(move || rx.iter().map(u64::from).sum::<u64>());
        producer.join().unwrap();
        assert_eq!(sum, 499_500);
    });
}

// ---------------------------------------------------------------------
// fiber::sync: std's API and poisoning.
// ---------------------------------------------------------------------

#[test]
fn a_fiber_that_panics_holding_a_mutex_poisons_it_like_std() {
    on_runtime(|| {
        let m = Arc::new(fiber::sync::Mutex::new(1));
        let m2 = m.clone();
        let r = fiber::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("holding");
        })
        .join();
        assert!(r.unwrap_err().is_panic());
        assert!(m.is_poisoned());
        let g = m.lock().unwrap_err().into_inner();
        assert_eq!(*g, 1);
        drop(g);
        assert!(matches!(m.try_lock(), Err(std::sync::TryLockError::Poisoned(_))));
        m.clear_poison();
        assert!(m.lock().is_ok());
    });
}

#[test]
fn rwlock_try_forms_return_would_block_like_std() {
    on_runtime(|| {
        let l = fiber::sync::RwLock::new(5);
        let r = l.read().unwrap();
        assert!(matches!(l.try_write(), Err(std::sync::TryLockError::WouldBlock)));
        assert_eq!(*l.try_read().unwrap(), 5);
        drop(r);
        let w = l.write().unwrap();
        assert!(matches!(l.try_read(), Err(std::sync::TryLockError::WouldBlock)));
        drop(w);
    });
}

#[test]
fn condvar_wait_timeout_reports_the_timeout_and_lasts_at_least_the_duration() {
    on_runtime(|| {
        let m = fiber::sync::Mutex::new(());
        let c = fiber::sync::Condvar::new();
        let t = Instant::now();
        let (g, res) = c.wait_timeout(m.lock().unwrap(), ms(30)).unwrap();
        drop(g);
        assert!(res.timed_out());
        assert!(t.elapsed() >= ms(30));
        let (_g, res) = c.wait_timeout_while(m.lock().unwrap(), ms(10), |_| true).unwrap();
        assert!(res.timed_out());
    });
}

#[test]
fn barrier_has_exactly_one_leader_per_generation() {
    on_runtime(|| {
        let b = Arc::new(fiber::sync::Barrier::new(4));
        let leaders = fiber::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let b = b.clone();
                    s.spawn(move || b.wait().is_leader())
                })
                .collect();
            hs.into_iter()
                .filter(|_| true)
                .map(|h| h.join().unwrap() as usize)
                .sum::<usize>()
        });
        assert_eq!(leaders, 1);
        // std: a barrier of 0 never blocks either.
        assert!(fiber::sync::Barrier::new(0).wait().is_leader());
    });
}

#[test]
fn once_lock_and_lazy_lock_follow_std() {
    on_runtime(|| {
        let cell = Arc::new(fiber::sync::OnceLock::new());
        let runs = Arc::new(AtomicUsize::new(0));
        fiber::scope(|s| {
            for _ in 0..8 {
                let (cell, runs) = (cell.clone(), runs.clone());
                s.spawn(move || {
                    *cell.get_or_init(|| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        fiber::sleep(ms(10)).unwrap();
                        7
                    })
                });
            }
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(cell.set(8), Err(8));
        assert_eq!(cell.get(), Some(&7));

        // std's LazyLock: an initializer that panicked poisons it; a later
        // access panics too.
        let lazy = Arc::new(fiber::sync::LazyLock::new(|| -> u32 { panic!("init failed") }));
        let l = lazy.clone();
        assert!(fiber::spawn(move || *fiber::sync::LazyLock::force(&l)).join().is_err());
        let l = lazy.clone();
        let second = fiber::spawn(move || *fiber::sync::LazyLock::force(&l)).join();
        assert!(second.unwrap_err().is_panic());
    });
}

// Semaphore: tokio's shape; zero-permit requests are granted at once,
// MAX_PERMITS is enforced with a panic naming the type.
#[test]
fn semaphore_edges() {
    on_runtime(|| {
        let s = fiber::sync::Semaphore::new(1);
        let p = s.acquire().unwrap();
        assert!(s.try_acquire().is_none());
        assert_eq!(s.try_acquire_many(0).unwrap().num_permits(), 0);
        assert_eq!(s.acquire_many(0).unwrap().num_permits(), 0);
        drop(p);
        assert_eq!(s.available_permits(), 1);
        s.acquire().unwrap().forget();
        assert_eq!(s.available_permits(), 0);
        let msg = panic_message(|| {
            fiber::sync::Semaphore::new(fiber::sync::Semaphore::MAX_PERMITS + 1);
        })
        .unwrap();
        assert!(msg.contains("MAX_PERMITS"), "{msg}");
        let full = fiber::sync::Semaphore::new(fiber::sync::Semaphore::MAX_PERMITS);
        let msg = panic_message(|| full.add_permits(1)).unwrap();
        assert!(msg.contains("MAX_PERMITS"), "{msg}");
        assert_eq!(full.available_permits(), fiber::sync::Semaphore::MAX_PERMITS);
    });
}

// ---------------------------------------------------------------------
// fiber::net: std's API and error kinds.
// ---------------------------------------------------------------------

#[test]
fn net_timeouts_and_error_kinds_match_std() {
    on_runtime(|| {
        use std::io::Read;
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let zero = fiber::net::TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
        assert_eq!(zero.kind(), std::io::ErrorKind::InvalidInput);
        let mut client = fiber::net::TcpStream::connect(addr).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let e = client.set_read_timeout(Some(Duration::ZERO)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        client.set_read_timeout(Some(ms(20))).unwrap();
        assert_eq!(client.read_timeout().unwrap(), Some(ms(20)));
        let t = Instant::now();
        let e = client.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(t.elapsed() >= ms(20));
        // An empty buffer reads Ok(0) at once, as in std.
        assert_eq!(client.read(&mut []).unwrap(), 0);
        client.set_read_timeout(None).unwrap();
        assert_eq!(client.read_timeout().unwrap(), None);
    });
}

// "A fiber blocked in accept (or read) is stopped by cancelling it: the
// call returns an io::Error of kind Other whose inner error is
// fiber::Cancelled".
#[test]
fn a_cancelled_accept_and_read_return_other_wrapping_cancelled() {
    on_runtime(|| {
        use std::io::Read;
        let listener = fiber::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let e = cancelled_while(move || listener.accept().map(|_| ()).unwrap_err());
        assert_eq!(e.kind(), std::io::ErrorKind::Other);
        assert!(
            e.get_ref().unwrap().downcast_ref::<fiber::Cancelled>().is_some(),
            "{e:?}"
        );
        let listener = fiber::net::TcpListener::bind(addr).unwrap();
        let mut client = fiber::net::TcpStream::connect(addr).unwrap();
        let _server = listener.accept().unwrap();
        let e = cancelled_while(move || client.read(&mut [0u8; 4]).unwrap_err());
        assert_eq!(e.kind(), std::io::ErrorKind::Other);
        assert!(
            e.get_ref().unwrap().downcast_ref::<fiber::Cancelled>().is_some(),
            "{e:?}"
        );
    });
}

// UDP as std: `send` on an unconnected socket is an error; `recv_from`
// with a short buffer truncates.
#[test]
fn udp_edges_match_std() {
    on_runtime(|| {
        let a = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = fiber::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let std_a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let std_err = std_a.send(b"x").unwrap_err().kind();
        assert_eq!(a.send(b"x").unwrap_err().kind(), std_err);
        a.send_to(b"hello", b.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 3];
        let (n, from) = b.recv_from(&mut buf).unwrap();
        assert_eq!((n, &buf, from), (3, b"hel", a.local_addr().unwrap()));
        assert_eq!(a.peer_addr().unwrap_err().kind(), std_a.peer_addr().unwrap_err().kind());
    });
}

// ---------------------------------------------------------------------
// More of "Shutdown", "Blocking calls" and the idle timeout.
// ---------------------------------------------------------------------

// "a fiber waiting for a fiber::sync lock ... keeps the whole grace time,
// since a plain thread may release it": the fiber gets the lock and
// finishes its work; the drop returns once it has.
#[test]
fn a_fiber_waiting_for_a_lock_a_thread_holds_finishes_during_the_grace_time() {
    within(20, || {
        let rt = rt_grace(2, Duration::from_secs(5));
        let m = Arc::new(fiber::sync::Mutex::new(0u32));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let m_thread = m.clone();
        let holder = std::thread::spawn(move || {
            let mut g = m_thread.lock().unwrap();
            held_tx.send(()).unwrap();
            std::thread::sleep(ms(200));
            *g += 1;
        });
        held_rx.recv().unwrap();
        let m_fiber = m.clone();
        drop(rt.spawn(move || *m_fiber.lock().unwrap() += 10));
        wait_parked(&rt, 1);
        let t = Instant::now();
        drop(rt);
        holder.join().unwrap();
        assert_eq!(*m.lock().unwrap(), 11, "the fiber's update was lost");
        assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    });
}

// "clean-up in fiber::non_cancellable that sleeps or flushes runs to its
// end" during the grace time.
#[test]
fn non_cancellable_clean_up_that_sleeps_runs_to_its_end_at_shutdown() {
    within(20, || {
        let rt = rt_grace(2, Duration::from_secs(5));
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        drop(rt.spawn(move || {
            let _ = fiber::sleep(Duration::from_secs(60));
            fiber::non_cancellable(|| {
                for _ in 0..10 {
                    fiber::sleep(ms(10)).unwrap();
                }
                d.store(true, Ordering::SeqCst);
            });
        }));
        wait_parked(&rt, 1);
        drop(rt);
        assert!(done.load(Ordering::SeqCst), "the clean-up was cut short");
    });
}

/// Threads of this process.
fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

// "an idle pool thread ends after 10 s, and all of them end when the
// runtime is dropped".
#[test]
fn blocking_pool_threads_end_when_the_runtime_is_dropped() {
    in_child("blocking_pool_threads_end_when_the_runtime_is_dropped", 30, || {
        let before = thread_count();
        let rt = rt_grace(1, ms(300));
        rt.block_on(|| {
            fiber::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| fiber::blocking(|| std::thread::sleep(ms(30))));
                }
            });
        });
        assert!(thread_count() > before + 4, "the pool did not grow");
        drop(rt);
        let start = Instant::now();
        while thread_count() > before {
            assert!(
                start.elapsed() < Duration::from_secs(3),
                "{} threads left after the drop ({} before)",
                thread_count(),
                before
            );
            std::thread::sleep(ms(10));
        }
    });
}

// An idle timeout of zero (accepted by the variable and the builder): the
// pool never exceeds max_workers while computing fibers get drained and
// replaced, and every fiber finishes.
#[test]
fn a_zero_idle_timeout_keeps_the_pool_within_its_ceiling_and_makes_progress() {
    within(30, || {
        let rt = fiber::Runtime::builder()
            .workers(1)
            .max_workers(2)
            .idle_timeout(Duration::ZERO)
            .shutdown_timeout(ms(300))
            .build()
            .unwrap();
        let most = Arc::new(AtomicUsize::new(0));
        let m = most.clone();
        let sum = rt.block_on(move || {
            let hs: Vec<_> = (0..4u64)
                .map(|i| {
                    fiber::spawn(move || {
                        let t = Instant::now();
                        while t.elapsed() < ms(60) {
                            std::hint::spin_loop();
                        }
                        i
                    })
                })
                .collect();
            let mut sum = 0;
            for h in hs {
                m.fetch_max(fiber::stats().runtime.workers, Ordering::SeqCst);
                sum += h.join().unwrap();
            }
            sum
        });
        assert_eq!(sum, 6);
        let workers = rt.stats().workers;
        assert!(most.load(Ordering::SeqCst) <= 2 && workers <= 2, "{most:?} {workers}");
    });
}

// `Runtime::shutdown_timeout(ZERO)`: a fiber that ignores its cancel is
// unwound at once (its destructors run), without waiting.
#[test]
fn shutdown_timeout_zero_unwinds_at_once_and_runs_destructors() {
    within(20, || {
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let rt = rt_grace(1, Duration::from_secs(30));
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = Flag(dropped.clone());
        drop(rt.spawn(move || {
            let _flag = flag;
            stubborn_sleep();
        }));
        wait_parked(&rt, 1);
        let t = Instant::now();
        rt.shutdown_timeout(Duration::ZERO);
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        assert!(dropped.load(Ordering::SeqCst));
    });
}

// `bounded(cap)` with a capacity that cannot be addressed panics naming
// the capacity (its rustdoc).
#[test]
fn an_impossible_capacity_panics_naming_it() {
    let msg = panic_message(|| {
        let _ = fiber::chan::bounded::<u64>(usize::MAX);
    })
    .expect("no panic");
    assert!(msg.contains(&usize::MAX.to_string()), "{msg}");
    // "a capacity past a quarter of usize::MAX", even of a zero-sized type.
    let cap = usize::MAX / 4 + 1;
    let msg = panic_message(|| {
        let _ = fiber::chan::bounded::<()>(cap);
    })
    .expect("no panic");
    assert!(msg.contains(&cap.to_string()), "{msg}");
}

// FiberLocal::try_with never fails; `fiber_local!` values are per fiber.
#[test]
fn fiber_local_try_with_and_per_fiber_values() {
    fiber::fiber_local! {
        static N: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    on_runtime(|| {
        N.set(5);
        let other = fiber::spawn(|| N.get()).join().unwrap();
        assert_eq!(other, 0);
        assert_eq!(N.try_with(|c| c.get()), Ok(5));
    });
}

// ---------------------------------------------------------------------
// Handles (README: "spawn from outside: fiber::Handle (Runtime::handle,
// Handle::current)").
// ---------------------------------------------------------------------

#[test]
fn handles_spawn_from_threads_and_refuse_after_shutdown() {
    within(20, || {
        assert!(fiber::Handle::try_current().is_none());
        let msg = panic_message(|| drop(fiber::Handle::current())).expect("no panic");
        assert!(msg.contains("Handle::current"), "{msg}");
        let rt = rt_grace(1, ms(200));
        let h = rt.handle();
        let from_thread = std::thread::spawn({
            let h = h.clone();
            move || (h.spawn(|| 2).join().unwrap(), h.block_on(|| 3))
        })
        .join()
        .unwrap();
        assert_eq!(from_thread, (2, 3));
        let inside = rt.block_on(|| fiber::Handle::try_current().is_some());
        assert!(inside);
        drop(rt);
        assert!(h.try_spawn(|| ()).is_err());
    });
}

// Builder::spawn's rustdoc: "While the runtime shuts down, a spawn from one
// of its own fibers succeeds, but the child is cancelled before it starts
// (its closure is dropped, its join reports Cancelled)".
#[test]
fn a_spawn_during_shutdown_is_cancelled_before_it_starts() {
    within(20, || {
        let rt = rt_grace(1, Duration::from_secs(5));
        let ran = Arc::new(AtomicBool::new(false));
        let result = Arc::new(std::sync::Mutex::new(None));
        let (r, out) = (ran.clone(), result.clone());
        drop(rt.spawn(move || {
            let _ = fiber::sleep(Duration::from_secs(60));
            // Cancelled by the shutdown: spawn a child now.
            let child = fiber::Builder::new()
                .spawn(move || r.store(true, Ordering::SeqCst))
                .expect("a spawn from an own fiber succeeds");
            let cancelled = fiber::non_cancellable(|| child.join()).is_err_and(|e| e.is_cancelled());
            *out.lock().unwrap() = Some(cancelled);
        }));
        wait_parked(&rt, 1);
        drop(rt);
        assert!(!ran.load(Ordering::SeqCst), "the child ran");
        assert_eq!(*result.lock().unwrap(), Some(true));
    });
}
