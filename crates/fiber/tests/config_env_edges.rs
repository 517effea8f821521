//! Adversarial: `FIBER_*` values that are not UTF-8, or empty for a switch
//! that is on by default, are errors naming the variable (README:
//! "a bad value is an error naming the variable, never a silent default").
//! Each case runs in a child process, since the environment is per process.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::process::Command;

const CHILD: &str = "FIBER_CONFIG_EDGES_CHILD";

/// Child: build a runtime from the environment and print the outcome.
#[test]
fn build_from_env_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    match fiber::Runtime::builder().build() {
        Ok(_) => println!("BUILD-OK"),
        Err(e) => println!("BUILD-ERR {e}"),
    }
}

fn build_with(var: &str, value: OsString) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "build_from_env_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FIBER_") {
            cmd.env_remove(name);
        }
    }
    cmd.env(var, value);
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.find("BUILD-") {
        Some(at) => stdout[at..].lines().next().unwrap_or_default().to_string(),
        None => format!("no outcome line: {stdout}"),
    }
}

#[test]
fn a_value_that_is_not_utf8_is_an_error_naming_the_variable() {
    for var in [
        "FIBER_WORKERS",
        "FIBER_STACK_SIZE",
        "FIBER_DEBUG_STALL",
        "FIBER_MAX_BLOCKING",
    ] {
        let line = build_with(var, OsString::from_vec(vec![b'4', 0xff]));
        assert!(line.starts_with("BUILD-ERR") && line.contains(var), "{var}: {line}");
    }
}

/// A `FIBER_*` name the runtime does not read is not read at all (README),
/// whatever its value: it was an error when its value was not UTF-8.
#[test]
fn a_name_the_runtime_does_not_read_is_ignored() {
    for var in ["FIBER_THREAD_NAME", "FIBER_SOMETHING_ELSE"] {
        let line = build_with(var, OsString::from_vec(vec![b'4', 0xff]));
        assert!(line.starts_with("BUILD-OK"), "{var}: {line}");
    }
}

#[test]
fn an_empty_value_does_not_turn_off_a_switch_that_is_on_by_default() {
    for var in ["FIBER_IO_HARVEST", "FIBER_DEBUG_STALL"] {
        let line = build_with(var, OsString::new());
        assert!(line.starts_with("BUILD-ERR") && line.contains(var), "{var}: {line}");
    }
}
