//! Every `FIBER_*` variable with garbage, and builder values out of range.

use super::*;

fn resolve(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::resolve_with(&Overrides::default(), |name| {
        vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    })
}

fn error_of(vars: &[(&str, &str)]) -> ConfigError {
    resolve(vars).expect_err("expected a configuration error")
}

#[test]
fn defaults_follow_the_cores() {
    let config = resolve(&[]).unwrap();
    assert_eq!(config.workers, cores().min(MAX_WORKERS));
    assert_eq!(config.max_workers, (2 * cores()).min(MAX_WORKERS).max(config.workers));
    assert_eq!(config.stacks.size, fiber_core::stack::DEFAULT_STACK_SIZE);
    assert!(config.stall_report);
}

#[test]
fn fiber_workers_garbage_zero_and_too_large_name_the_variable() {
    let e = error_of(&[("FIBER_WORKERS", "abc")]);
    assert_eq!(e.to_string(), "invalid FIBER_WORKERS=\"abc\": not a whole number");
    let e = error_of(&[("FIBER_WORKERS", "0")]);
    assert_eq!(e.to_string(), "invalid FIBER_WORKERS=\"0\": must be at least 1");
    let e = error_of(&[("FIBER_WORKERS", "100000")]);
    assert_eq!(
        e.to_string(),
        format!("invalid FIBER_WORKERS=\"100000\": must be at most {MAX_WORKERS}")
    );
}

#[test]
fn fiber_max_workers_below_workers_is_an_error() {
    let e = error_of(&[("FIBER_WORKERS", "4"), ("FIBER_MAX_WORKERS", "2")]);
    assert_eq!(e.setting, "FIBER_MAX_WORKERS");
    assert!(e.reason.contains("at least the number of workers (4)"), "{e}");
    let e = error_of(&[("FIBER_MAX_WORKERS", "x")]);
    assert_eq!(e.to_string(), "invalid FIBER_MAX_WORKERS=\"x\": not a whole number");
}

#[test]
fn a_ceiling_alone_lowers_the_default_worker_count() {
    // The default worker count (the cores) gives way to an explicit
    // ceiling below it, whatever the machine: one worker, growth off.
    let config = resolve(&[("FIBER_MAX_WORKERS", "1")]).unwrap();
    assert_eq!((config.workers, config.max_workers), (1, 1));
    let config = Config::resolve_with(
        &Overrides {
            max_workers: Some(1),
            ..Overrides::default()
        },
        |_| None,
    )
    .unwrap();
    assert_eq!((config.workers, config.max_workers), (1, 1));
    // A ceiling above the cores leaves the default alone.
    let cores = Config::default().workers;
    let config = resolve(&[("FIBER_MAX_WORKERS", &(cores + 1).to_string())]).unwrap();
    assert_eq!(config.workers, cores);
}

#[test]
fn max_equal_to_workers_turns_growth_off() {
    let config = resolve(&[("FIBER_WORKERS", "3"), ("FIBER_MAX_WORKERS", "3")]).unwrap();
    assert_eq!((config.workers, config.max_workers), (3, 3));
}

#[test]
fn fiber_stack_size_accepts_units_and_rejects_garbage() {
    assert_eq!(resolve(&[("FIBER_STACK_SIZE", "64k")]).unwrap().stacks.size, 64 * 1024);
    assert_eq!(resolve(&[("FIBER_STACK_SIZE", "1m")]).unwrap().stacks.size, 1024 * 1024);
    assert_eq!(resolve(&[("FIBER_STACK_SIZE", "65536")]).unwrap().stacks.size, 65536);
    let e = error_of(&[("FIBER_STACK_SIZE", "big")]);
    assert_eq!(e.setting, "FIBER_STACK_SIZE");
    let e = error_of(&[("FIBER_STACK_SIZE", "4k")]);
    assert_eq!(e.setting, "FIBER_STACK_SIZE");
    assert!(e.reason.contains("between 16384"), "{e}");
    let e = error_of(&[("FIBER_STACK_SIZE", "8k")]);
    assert!(e.to_string().contains("FIBER_STACK_SIZE"), "{e}");
    assert_eq!(resolve(&[("FIBER_STACK_SIZE", "1g")]).unwrap().stacks.size, 1 << 30);
    assert_eq!(resolve(&[("FIBER_STACK_SIZE", "1G")]).unwrap().stacks.size, 1 << 30);
    let e = error_of(&[("FIBER_STACK_SIZE", "2g")]);
    assert_eq!(e.setting, "FIBER_STACK_SIZE");
}

#[test]
fn boolean_variables_reject_garbage() {
    for var in [
        "FIBER_STATS",
        "FIBER_DEBUG_STALL",
        "FIBER_DEADLOCK_ABORT",
        "FIBER_BACKTRACE",
    ] {
        let e = error_of(&[(var, "maybe")]);
        assert_eq!(
            e.to_string(),
            format!("invalid {var}=\"maybe\": expected 1 (or true, yes, on) or 0 (or false, no, off)")
        );
    }
    // Empty is neither: it would silently turn off a switch that is on by
    // default.
    for var in ["FIBER_IO_HARVEST", "FIBER_DEBUG_STALL", "FIBER_STATS"] {
        assert_eq!(error_of(&[(var, "")]).setting, var);
    }
    let config = resolve(&[
        ("FIBER_STATS", "1"),
        ("FIBER_DEBUG_STALL", "0"),
        ("FIBER_DEADLOCK_ABORT", "1"),
        ("FIBER_BACKTRACE", "1"),
        ("FIBER_TRACE_SPANS", "1"),
        ("FIBER_IO_HARVEST", "1"),
        ("FIBER_IO_PARK", "1"),
    ])
    .unwrap();
    assert!(config.io_harvest);
    assert!(config.io_park);
    assert!(!resolve(&[("FIBER_IO_HARVEST", "0")]).unwrap().io_harvest);
    // `io_park` needs `io_harvest`: the contradiction is an error, not
    // silently ignored, naming the variables that made it (it named the
    // builder's option, which the user never called).
    let contradiction = error_of(&[("FIBER_IO_HARVEST", "0"), ("FIBER_IO_PARK", "1")]);
    assert_eq!(contradiction.setting, "FIBER_IO_PARK");
    assert!(
        contradiction.to_string().contains("FIBER_IO_HARVEST"),
        "{contradiction}"
    );
    // It quotes what the user wrote.
    assert!(
        contradiction.to_string().contains("FIBER_IO_PARK=\"1\""),
        "{contradiction}"
    );
    assert_eq!(resolve(&[]).unwrap().io_park, crate::config::DEFAULT_IO_PARK);
    assert!(resolve(&[]).unwrap().io_harvest);
    assert!(config.fiber_spans);
    assert!(config.print_stats && !config.stall_report && config.deadlock_abort);
    assert!(config.park_backtraces);
    assert!(!resolve(&[]).unwrap().park_backtraces);
}

#[test]
fn fiber_idle_timeout_ms_rejects_garbage() {
    let e = error_of(&[("FIBER_IDLE_TIMEOUT_MS", "-5")]);
    assert_eq!(e.setting, "FIBER_IDLE_TIMEOUT_MS");
    assert_eq!(
        resolve(&[("FIBER_IDLE_TIMEOUT_MS", "250")]).unwrap().idle_timeout,
        Duration::from_millis(250)
    );
}

#[test]
fn builder_values_win_over_the_environment() {
    let overrides = Overrides {
        workers: Some(3),
        ..Overrides::default()
    };
    let config = Config::resolve_with(&overrides, |name| (name == "FIBER_WORKERS").then(|| "7".to_string())).unwrap();
    assert_eq!(config.workers, 3);
    let overrides = Overrides {
        workers: Some(0),
        ..Overrides::default()
    };
    let e = Config::resolve_with(&overrides, |_| None).unwrap_err();
    assert_eq!(e.setting, "workers");
    let overrides = Overrides {
        workers: Some(4),
        max_workers: Some(2),
        ..Overrides::default()
    };
    let e = Config::resolve_with(&overrides, |_| None).unwrap_err();
    assert_eq!(e.setting, "max_workers");
}

/// A builder value wins over a conflicting environment value of the other
/// bound: `workers(4)` beside `FIBER_MAX_WORKERS=2` raises the ceiling,
/// `max_workers(1)` beside `FIBER_WORKERS=8` lowers the count. Both were
/// refused, so an operator's cap in the environment stopped every program
/// that sets its worker count from starting. Two values from the same
/// layer that contradict each other stay an error.
// Failed before the fix: invalid FIBER_MAX_WORKERS="2": must be at least the number of workers (4)
#[test]
fn builder_worker_counts_win_over_the_other_bound_from_the_environment() {
    let overrides = Overrides {
        workers: Some(4),
        ..Overrides::default()
    };
    let config = Config::resolve_with(&overrides, |name| {
        (name == "FIBER_MAX_WORKERS").then(|| "2".to_string())
    })
    .unwrap();
    assert_eq!((config.workers, config.max_workers), (4, 4));
    let overrides = Overrides {
        max_workers: Some(1),
        ..Overrides::default()
    };
    let config = Config::resolve_with(&overrides, |name| (name == "FIBER_WORKERS").then(|| "8".to_string())).unwrap();
    assert_eq!((config.workers, config.max_workers), (1, 1));
    let e = Config::resolve_with(&Overrides::default(), |name| match name {
        "FIBER_WORKERS" => Some("4".to_string()),
        "FIBER_MAX_WORKERS" => Some("2".to_string()),
        _ => None,
    })
    .unwrap_err();
    assert_eq!(e.setting, "FIBER_MAX_WORKERS");
}

/// The same rule for the I/O pair: a builder value wins over the
/// environment's conflicting other half (`io_harvest(false)` beside
/// `FIBER_IO_PARK=1` was refused); a contradiction within one layer stays
/// an error.
// Failed before the fix: invalid FIBER_IO_PARK="1": needs io_harvest on
#[test]
fn builder_io_settings_win_over_the_other_half_from_the_environment() {
    let overrides = Overrides {
        io_harvest: Some(false),
        ..Overrides::default()
    };
    let config = Config::resolve_with(&overrides, |name| (name == "FIBER_IO_PARK").then(|| "1".to_string())).unwrap();
    assert!(!config.io_harvest && !config.io_park);
    let overrides = Overrides {
        io_park: Some(true),
        ..Overrides::default()
    };
    let config =
        Config::resolve_with(&overrides, |name| (name == "FIBER_IO_HARVEST").then(|| "0".to_string())).unwrap();
    assert!(config.io_harvest && config.io_park);
    let overrides = Overrides {
        io_park: Some(true),
        io_harvest: Some(false),
        ..Overrides::default()
    };
    assert_eq!(
        Config::resolve_with(&overrides, |_| None).unwrap_err().setting,
        "io_park"
    );
    let e = Config::resolve_with(&Overrides::default(), |name| match name {
        "FIBER_IO_PARK" => Some("1".to_string()),
        "FIBER_IO_HARVEST" => Some("0".to_string()),
        _ => None,
    })
    .unwrap_err();
    assert_eq!(e.setting, "FIBER_IO_PARK");
}

#[test]
fn fiber_unguarded_takes_refuse_or_allow() {
    use fiber_core::UnguardedPolicy;
    assert_eq!(resolve(&[]).unwrap().stacks.unguarded, UnguardedPolicy::Refuse);
    let config = resolve(&[("FIBER_UNGUARDED", "allow")]).unwrap();
    assert_eq!(config.stacks.unguarded, UnguardedPolicy::Allow);
    let config = resolve(&[("FIBER_UNGUARDED", "refuse")]).unwrap();
    assert_eq!(config.stacks.unguarded, UnguardedPolicy::Refuse);
    let e = error_of(&[("FIBER_UNGUARDED", "yes")]);
    assert_eq!(
        e.to_string(),
        "invalid FIBER_UNGUARDED=\"yes\": expected `refuse` or `allow`"
    );
}

#[test]
fn fiber_blocking_keep_alive_ms_is_parsed_and_the_builder_wins() {
    assert_eq!(resolve(&[]).unwrap().thread_keep_alive, DEFAULT_THREAD_KEEP_ALIVE);
    assert_eq!(
        resolve(&[("FIBER_BLOCKING_KEEP_ALIVE_MS", "250")])
            .unwrap()
            .thread_keep_alive,
        Duration::from_millis(250)
    );
    assert_eq!(
        resolve(&[("FIBER_BLOCKING_KEEP_ALIVE_MS", "0")])
            .unwrap()
            .thread_keep_alive,
        Duration::ZERO
    );
    let e = error_of(&[("FIBER_BLOCKING_KEEP_ALIVE_MS", "soon")]);
    assert_eq!(e.setting, "FIBER_BLOCKING_KEEP_ALIVE_MS");
    let overrides = Overrides {
        thread_keep_alive: Some(Duration::MAX),
        ..Overrides::default()
    };
    let config = Config::resolve_with(&overrides, |name| {
        (name == "FIBER_BLOCKING_KEEP_ALIVE_MS").then(|| "5".to_string())
    });
    assert_eq!(config.unwrap().thread_keep_alive, Duration::MAX);
}

#[test]
fn fiber_max_blocking_is_validated_and_the_builder_wins() {
    assert_eq!(resolve(&[]).unwrap().max_blocking_threads, DEFAULT_MAX_BLOCKING_THREADS);
    assert_eq!(resolve(&[("FIBER_MAX_BLOCKING", "8")]).unwrap().max_blocking_threads, 8);
    let e = error_of(&[("FIBER_MAX_BLOCKING", "0")]);
    assert_eq!(e.to_string(), "invalid FIBER_MAX_BLOCKING=\"0\": must be at least 1");
    let e = error_of(&[("FIBER_MAX_BLOCKING", "many")]);
    assert_eq!(e.to_string(), "invalid FIBER_MAX_BLOCKING=\"many\": not a whole number");
    let e = error_of(&[("FIBER_MAX_BLOCKING", "1000000")]);
    assert_eq!(e.setting, "FIBER_MAX_BLOCKING");
    let overrides = Overrides {
        max_blocking_threads: Some(3),
        ..Overrides::default()
    };
    let config = Config::resolve_with(&overrides, |name| {
        (name == "FIBER_MAX_BLOCKING").then(|| "9".to_string())
    });
    assert_eq!(config.unwrap().max_blocking_threads, 3);
    let bad = Overrides {
        max_blocking_threads: Some(0),
        ..Overrides::default()
    };
    assert_eq!(
        Config::resolve_with(&bad, |_| None).unwrap_err().setting,
        "max_blocking_threads"
    );
}

#[test]
fn a_dump_signal_other_than_sigusr1_or_sigusr2_is_refused() {
    for signal in [libc::SIGSEGV, libc::SIGINT, libc::SIGKILL, 0, -1, 9999] {
        let config = Config {
            dump_signal: Some(signal),
            ..Config::default()
        };
        assert_eq!(config.validate().unwrap_err().setting, "dump_signal", "{signal}");
    }
    for signal in [libc::SIGUSR1, libc::SIGUSR2] {
        let config = Config {
            dump_signal: Some(signal),
            ..Config::default()
        };
        assert!(config.validate().is_ok());
    }
}

/// `VARIABLES` (the names checked for values that are not UTF-8) is exactly
/// the set of names `resolve_with` looks up.
#[test]
fn the_variable_list_is_what_resolve_reads() {
    let asked = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let _ = Config::resolve_with(&Overrides::default(), |name| {
        asked.borrow_mut().insert(name.to_string());
        None
    });
    let listed: std::collections::BTreeSet<String> = VARIABLES.iter().map(|s| s.to_string()).collect();
    assert_eq!(asked.into_inner(), listed);
}
