//! Runtime configuration: every `FIBER_*` environment variable is read and
//! validated here, and nowhere else. Explicit builder values win over the
//! environment; a bad value is an error naming the variable, never a silent
//! default.
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `FIBER_WORKERS` | workers at start (1..=`MAX_WORKERS`) | number of cores |
//! | `FIBER_MAX_WORKERS` | elastic pool ceiling (>= workers) | 2 x cores (at least workers) |
//! | `FIBER_STACK_SIZE` | usable bytes per fiber stack (suffix `k`/`m`/`g` allowed, 16k to 1g) | 256k (1m in a build with debug assertions) |
//! | `FIBER_IDLE_TIMEOUT_MS` | idle time after which an extra worker retires; also how long a worker may run one fiber without a yield point before it is drained and replaced | 5000 |
//! | `FIBER_SHUTDOWN_TIMEOUT_MS` | grace time for cancelled fibers at shutdown | 5000 |
//! | `FIBER_STATS` | `1`: print counters at shutdown | `0` |
//! | `FIBER_DEBUG_STALL` | `0`: no stall report for fibers running > 5 s | `1` |
//! | `FIBER_DEADLOCK_ABORT` | `1`: abort after a deadlock report | `0` |
//! | `FIBER_DUMP_SIGNAL` | `SIGUSR1` or `SIGUSR2` (or `USR1` / `USR2`, any case; empty, `0` or `off`: none): print the fiber dump on that signal | unset |
//! | `FIBER_UNGUARDED` | `refuse` or `allow` a stack without a hardware guard (only on kernels before 6.13, past the map-count budget) | `refuse` |
//! | `FIBER_BACKTRACE` | `1`: capture a backtrace at every park, shown by the fiber dump (costly: a stack walk per park) | `0` |
//! | `FIBER_IO_HARVEST` | `0`: workers leave socket readiness to the I/O layer's poller thread instead of taking ready events themselves | `1` |
//! | `FIBER_IO_PARK` | `1`: one idle worker at a time waits for socket readiness in the I/O driver itself (needs `FIBER_IO_HARVEST` on) | `0` |
//! | `FIBER_TRACE_SPANS` | `1`: a `tracing` span per fiber (id, name), entered while it runs | `0` |
//! | `FIBER_MAX_BLOCKING` | cap on blocking-pool threads (1..=`MAX_BLOCKING_THREADS`) | 512 |
//! | `FIBER_BLOCKING_KEEP_ALIVE_MS` | idle time after which a blocking-pool thread exits (0: at once) | 10000 |

use fiber_core::stack::{MAX_STACK_SIZE, MIN_STACK_SIZE};
use fiber_core::StackConfig;
use std::fmt;
use std::time::Duration;

/// Hard ceiling on workers, to catch unit mistakes (`FIBER_WORKERS=100000`).
pub const MAX_WORKERS: usize = 1024;

/// Default idle time before an extra worker retires.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// Default cap on the threads of the blocking pool (`fiber::blocking`).
pub const DEFAULT_MAX_BLOCKING_THREADS: usize = 512;

/// Hard ceiling on blocking-pool threads, to catch unit mistakes.
pub const MAX_BLOCKING_THREADS: usize = 65_536;

/// How long a fiber may run without a yield point before the stall report.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(5);

/// Slots of the global injection ring (it overflows into an unbounded list).
pub const GLOBAL_QUEUE_SLOTS: usize = 4096;

/// A configuration value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The environment variable or builder option at fault.
    pub setting: String,
    /// The value given, as text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}={:?}: {}", self.setting, self.value, self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for std::io::Error {
    fn from(e: ConfigError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// A callback run on each worker thread as it starts or stops.
#[derive(Clone)]
pub struct ThreadHook(pub std::sync::Arc<dyn Fn() + Send + Sync>);

impl fmt::Debug for ThreadHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad("ThreadHook(..)")
    }
}

/// Everything a runtime needs to know, validated.
#[derive(Clone, Debug)]
pub struct Config {
    /// Run on each worker thread when it starts.
    pub on_thread_start: Option<ThreadHook>,
    /// Run on each worker thread just before it exits.
    pub on_thread_stop: Option<ThreadHook>,
    /// Workers at start.
    pub workers: usize,
    /// Elastic pool ceiling.
    pub max_workers: usize,
    /// Fiber stacks.
    pub stacks: StackConfig,
    /// Worker thread name prefix (`<name>-<index>`).
    pub thread_name: String,
    /// Idle time after which an extra worker (beyond `workers`) retires.
    pub idle_timeout: Duration,
    /// Print counters at shutdown.
    pub print_stats: bool,
    /// Report fibers running without a yield point for [`STALL_THRESHOLD`].
    pub stall_report: bool,
    /// Abort after a deadlock report.
    pub deadlock_abort: bool,
    /// Grace time at shutdown: how long cancelled fibers get to finish on
    /// the workers before what is left is unwound (`Duration::MAX`:
    /// forever).
    pub shutdown_timeout: Duration,
    /// Pin every fiber to the worker it first runs on (hard affinity).
    pub pinned: bool,
    /// Print the fiber dump when the process gets this signal
    /// (`FIBER_DUMP_SIGNAL`: `SIGUSR1` or `SIGUSR2`).
    pub dump_signal: Option<i32>,
    /// Cap on the blocking pool's threads (not workers; they do not count
    /// against `max_workers`).
    pub max_blocking_threads: usize,
    /// How long a blocking-pool thread waits idle for another call before
    /// it exits (`Duration::ZERO`: at once; `Duration::MAX`: never, until
    /// the runtime shuts down).
    pub thread_keep_alive: Duration,
    /// Capture a backtrace at every park for the fiber dump
    /// (`FIBER_BACKTRACE=1`; process-wide once any runtime turns it on).
    pub park_backtraces: bool,
    /// A `tracing` span per fiber (`FIBER_TRACE_SPANS=1`; process-wide
    /// once any runtime turns it on).
    pub fiber_spans: bool,
    /// Workers take ready I/O events themselves through fiber-core's
    /// `IoPoll` hook (`FIBER_IO_HARVEST`, default on).
    pub io_harvest: bool,
    /// One idle worker at a time waits for socket readiness in the I/O
    /// driver itself instead of on its wake-up word (`FIBER_IO_PARK`).
    /// Needs `io_harvest`.
    pub io_park: bool,
}

/// Whether an idle worker waits for I/O in the driver by default.
pub const DEFAULT_IO_PARK: bool = false;

/// Default grace time of a shutdown.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Default idle time after which a blocking-pool thread exits (tokio's
/// default too).
pub const DEFAULT_THREAD_KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Number of cores available to this process.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

impl Default for Config {
    fn default() -> Self {
        let cores = cores().min(MAX_WORKERS);
        Config {
            on_thread_start: None,
            on_thread_stop: None,
            workers: cores,
            max_workers: (2 * cores).min(MAX_WORKERS),
            stacks: StackConfig::default(),
            thread_name: "fiber-worker".to_string(),
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            print_stats: false,
            stall_report: true,
            deadlock_abort: false,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            pinned: false,
            dump_signal: None,
            max_blocking_threads: DEFAULT_MAX_BLOCKING_THREADS,
            thread_keep_alive: DEFAULT_THREAD_KEEP_ALIVE,
            park_backtraces: false,
            fiber_spans: false,
            io_harvest: true,
            io_park: DEFAULT_IO_PARK,
        }
    }
}

fn err(setting: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn parse_count(setting: &str, value: &str) -> Result<usize, ConfigError> {
    let n: usize = value
        .trim()
        .parse()
        .map_err(|_| err(setting, value, "not a whole number"))?;
    if n == 0 {
        return Err(err(setting, value, "must be at least 1"));
    }
    if n > MAX_WORKERS {
        return Err(err(setting, value, format!("must be at most {MAX_WORKERS}")));
    }
    Ok(n)
}

fn parse_blocking(setting: &str, value: &str) -> Result<usize, ConfigError> {
    let n: usize = value
        .trim()
        .parse()
        .map_err(|_| err(setting, value, "not a whole number"))?;
    if n == 0 {
        return Err(err(setting, value, "must be at least 1"));
    }
    if n > MAX_BLOCKING_THREADS {
        return Err(err(setting, value, format!("must be at most {MAX_BLOCKING_THREADS}")));
    }
    Ok(n)
}

fn parse_bool(setting: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        // Empty is not a spelling of either: it would silently turn off a
        // switch that is on by default (`FIBER_IO_HARVEST=`).
        _ => Err(err(
            setting,
            value,
            "expected 1 (or true, yes, on) or 0 (or false, no, off)",
        )),
    }
}

fn parse_size(setting: &str, value: &str) -> Result<usize, ConfigError> {
    let text = value.trim().to_ascii_lowercase();
    let (digits, unit) = match text.strip_suffix(['k', 'm', 'g']) {
        Some(digits) if text.ends_with('k') => (digits, 1024),
        Some(digits) if text.ends_with('m') => (digits, 1024 * 1024),
        Some(digits) => (digits, 1024 * 1024 * 1024),
        None => (text.as_str(), 1),
    };
    let n: usize = digits
        .trim()
        .parse()
        .map_err(|_| err(setting, value, "not a size (bytes, or with k/m/g)"))?;
    n.checked_mul(unit).ok_or_else(|| err(setting, value, "too large"))
}

fn parse_millis(setting: &str, value: &str) -> Result<Duration, ConfigError> {
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| err(setting, value, "not a whole number of milliseconds"))?;
    Ok(Duration::from_millis(n))
}

/// Builder-level overrides; `None` means "from the environment or default".
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `workers`
    pub workers: Option<usize>,
    /// `max_workers`
    pub max_workers: Option<usize>,
    /// `stack_size`
    pub stack_size: Option<usize>,
    /// `thread_name`
    pub thread_name: Option<String>,
    /// `idle_timeout`
    pub idle_timeout: Option<Duration>,
    /// `shutdown_timeout`
    pub shutdown_timeout: Option<Duration>,
    /// `pinned`
    pub pinned: Option<bool>,
    /// cap on guarded stacks (tests)
    pub max_guarded_stacks: Option<usize>,
    /// `on_thread_start`
    pub on_thread_start: Option<ThreadHook>,
    /// `on_thread_stop`
    pub on_thread_stop: Option<ThreadHook>,
    /// `max_blocking_threads`
    pub max_blocking_threads: Option<usize>,
    /// `thread_keep_alive`
    pub thread_keep_alive: Option<Duration>,
    /// `park_backtraces`
    pub park_backtraces: Option<bool>,
    /// `fiber_spans`
    pub fiber_spans: Option<bool>,
    /// `io_harvest`
    pub io_harvest: Option<bool>,
    /// `io_park`
    pub io_park: Option<bool>,
}

/// Every environment variable [`Config::resolve`] reads.
pub const VARIABLES: [&str; 16] = [
    "FIBER_WORKERS",
    "FIBER_MAX_WORKERS",
    "FIBER_STACK_SIZE",
    "FIBER_IDLE_TIMEOUT_MS",
    "FIBER_SHUTDOWN_TIMEOUT_MS",
    "FIBER_STATS",
    "FIBER_DEBUG_STALL",
    "FIBER_DEADLOCK_ABORT",
    "FIBER_DUMP_SIGNAL",
    "FIBER_BACKTRACE",
    "FIBER_IO_HARVEST",
    "FIBER_IO_PARK",
    "FIBER_TRACE_SPANS",
    "FIBER_UNGUARDED",
    "FIBER_MAX_BLOCKING",
    "FIBER_BLOCKING_KEEP_ALIVE_MS",
];

impl Config {
    /// Defaults, then the process environment, then `overrides`, validated.
    pub fn resolve(overrides: &Overrides) -> Result<Config, ConfigError> {
        // A value that is not UTF-8 is an error naming the variable, not
        // "unset" (which `std::env::var(..).ok()` would make it). Only the
        // variables this runtime reads: any other `FIBER_*` name is not
        // read at all (README).
        for name in VARIABLES {
            if let Some(value) = std::env::var_os(name) {
                if value.to_str().is_none() {
                    return Err(err(name, &value.to_string_lossy(), "not valid UTF-8"));
                }
            }
        }
        Self::resolve_with(overrides, |name| std::env::var(name).ok())
    }

    /// As [`resolve`](Self::resolve) with an explicit variable lookup.
    pub fn resolve_with(overrides: &Overrides, var: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let mut max_from_user = false;
        let mut workers_from_user = false;
        let mut max_setting = "max_workers";
        if let Some(v) = var("FIBER_WORKERS") {
            config.workers = parse_count("FIBER_WORKERS", &v)?;
            workers_from_user = true;
        }
        if let Some(v) = var("FIBER_MAX_WORKERS") {
            config.max_workers = parse_count("FIBER_MAX_WORKERS", &v)?;
            max_from_user = true;
            max_setting = "FIBER_MAX_WORKERS";
        }
        if let Some(v) = var("FIBER_STACK_SIZE") {
            config.stacks.size = parse_size("FIBER_STACK_SIZE", &v)?;
            if !(MIN_STACK_SIZE..=MAX_STACK_SIZE).contains(&config.stacks.size) {
                return Err(err(
                    "FIBER_STACK_SIZE",
                    &v,
                    format!("must be between {MIN_STACK_SIZE} and {MAX_STACK_SIZE} bytes (16k to 1g)"),
                ));
            }
        }
        if let Some(v) = var("FIBER_SHUTDOWN_TIMEOUT_MS") {
            config.shutdown_timeout = parse_millis("FIBER_SHUTDOWN_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = var("FIBER_IDLE_TIMEOUT_MS") {
            config.idle_timeout = parse_millis("FIBER_IDLE_TIMEOUT_MS", &v)?;
        }
        if let Some(v) = var("FIBER_STATS") {
            config.print_stats = parse_bool("FIBER_STATS", &v)?;
        }
        if let Some(v) = var("FIBER_DEBUG_STALL") {
            config.stall_report = parse_bool("FIBER_DEBUG_STALL", &v)?;
        }
        if let Some(v) = var("FIBER_DUMP_SIGNAL") {
            config.dump_signal = match v.trim().to_ascii_uppercase().as_str() {
                "" | "0" | "OFF" => None,
                "SIGUSR1" | "USR1" => Some(libc::SIGUSR1),
                "SIGUSR2" | "USR2" => Some(libc::SIGUSR2),
                _ => return Err(err("FIBER_DUMP_SIGNAL", &v, "expected SIGUSR1 or SIGUSR2")),
            };
        }
        if let Some(v) = var("FIBER_DEADLOCK_ABORT") {
            config.deadlock_abort = parse_bool("FIBER_DEADLOCK_ABORT", &v)?;
        }
        if let Some(v) = var("FIBER_UNGUARDED") {
            config.stacks.unguarded = fiber_core::UnguardedPolicy::parse(&v)
                .ok_or_else(|| err("FIBER_UNGUARDED", &v, "expected `refuse` or `allow`"))?;
        }
        if let Some(v) = var("FIBER_BACKTRACE") {
            config.park_backtraces = parse_bool("FIBER_BACKTRACE", &v)?;
        }
        if let Some(b) = overrides.park_backtraces {
            config.park_backtraces = b;
        }
        // Where each of the two came from, for the error naming a
        // contradiction: the variable, or the builder's option.
        let (mut harvest_setting, mut park_setting) = ("io_harvest", "io_park");
        let mut park_value = "true".to_string();
        if let Some(v) = var("FIBER_IO_HARVEST") {
            config.io_harvest = parse_bool("FIBER_IO_HARVEST", &v)?;
            harvest_setting = "FIBER_IO_HARVEST";
        }
        if let Some(b) = overrides.io_harvest {
            config.io_harvest = b;
            harvest_setting = "io_harvest";
        }
        if let Some(v) = var("FIBER_IO_PARK") {
            config.io_park = parse_bool("FIBER_IO_PARK", &v)?;
            park_setting = "FIBER_IO_PARK";
            park_value = v;
        }
        if let Some(b) = overrides.io_park {
            config.io_park = b;
            park_setting = "io_park";
            park_value = b.to_string();
        }
        let harvest_from_builder = overrides.io_harvest.is_some();
        let park_from_builder = overrides.io_park.is_some();
        if config.io_park && !config.io_harvest && harvest_from_builder && park_setting == "FIBER_IO_PARK" {
            // Builder values win: `io_harvest(false)` beside
            // `FIBER_IO_PARK=1` turns the driver wait off.
            config.io_park = false;
        } else if config.io_park && !config.io_harvest && park_from_builder && harvest_setting == "FIBER_IO_HARVEST" {
            // And `io_park(true)` beside `FIBER_IO_HARVEST=0` turns the
            // harvest it needs back on.
            config.io_harvest = true;
        } else if config.io_park && !config.io_harvest {
            return Err(err(
                park_setting,
                &park_value,
                format!(
                    "needs {harvest_setting} on (an idle worker can wait in the I/O driver only if workers take I/O)"
                ),
            ));
        }
        if let Some(v) = var("FIBER_TRACE_SPANS") {
            config.fiber_spans = parse_bool("FIBER_TRACE_SPANS", &v)?;
        }
        if let Some(b) = overrides.fiber_spans {
            config.fiber_spans = b;
        }
        if let Some(v) = var("FIBER_MAX_BLOCKING") {
            config.max_blocking_threads = parse_blocking("FIBER_MAX_BLOCKING", &v)?;
        }
        if let Some(n) = overrides.max_blocking_threads {
            config.max_blocking_threads = n;
        }
        if let Some(v) = var("FIBER_BLOCKING_KEEP_ALIVE_MS") {
            config.thread_keep_alive = parse_millis("FIBER_BLOCKING_KEEP_ALIVE_MS", &v)?;
        }
        if let Some(d) = overrides.thread_keep_alive {
            config.thread_keep_alive = d;
        }
        let workers_from_builder = overrides.workers.is_some();
        let max_from_builder = overrides.max_workers.is_some();
        if let Some(n) = overrides.workers {
            config.workers = n;
            workers_from_user = true;
        }
        if let Some(n) = overrides.max_workers {
            config.max_workers = n;
            max_from_user = true;
            max_setting = "max_workers";
        }
        if let Some(n) = overrides.stack_size {
            config.stacks.size = n;
        }
        if let Some(name) = &overrides.thread_name {
            config.thread_name = name.clone();
        }
        if let Some(d) = overrides.idle_timeout {
            config.idle_timeout = d;
        }
        if let Some(d) = overrides.shutdown_timeout {
            config.shutdown_timeout = d;
        }
        if let Some(p) = overrides.pinned {
            config.pinned = p;
        }
        config.stacks.max_guarded = overrides.max_guarded_stacks;
        config.on_thread_start = overrides.on_thread_start.clone();
        config.on_thread_stop = overrides.on_thread_stop.clone();
        if !max_from_user {
            config.max_workers = config.max_workers.max(config.workers);
        } else if !workers_from_user {
            // A default gives way to an explicit setting both ways: a
            // ceiling below the core count lowers the default worker count
            // (`max_workers(1)` runs one worker on any machine, as
            // `GOMAXPROCS=1` does), as an explicit `workers` above the
            // default ceiling raises that. A ceiling of 0 stays an error
            // (`validate`).
            config.workers = config.workers.min(config.max_workers).max(1);
        } else if config.max_workers < config.workers && workers_from_builder && !max_from_builder {
            // Builder values win over the environment: `Builder::workers(4)`
            // beside `FIBER_MAX_WORKERS=2` runs 4 workers (growth off).
            config.max_workers = config.workers;
        } else if config.max_workers < config.workers && max_from_builder && !workers_from_builder {
            // And `Builder::max_workers(1)` beside `FIBER_WORKERS=8` runs 1.
            // A ceiling of 0 stays an error (`validate`).
            config.workers = config.max_workers.max(1);
        } else if config.max_workers < config.workers {
            return Err(err(
                max_setting,
                &config.max_workers.to_string(),
                format!("must be at least the number of workers ({})", config.workers),
            ));
        }
        config.validate()?;
        Ok(config)
    }

    /// Check the settings against each other and their ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 || self.workers > MAX_WORKERS {
            return Err(err(
                "workers",
                &self.workers.to_string(),
                format!("must be between 1 and {MAX_WORKERS}"),
            ));
        }
        if self.max_workers > MAX_WORKERS {
            return Err(err(
                "max_workers",
                &self.max_workers.to_string(),
                format!("must be at most {MAX_WORKERS}"),
            ));
        }
        if self.max_workers < self.workers {
            return Err(err(
                "max_workers",
                &self.max_workers.to_string(),
                format!("must be at least workers ({})", self.workers),
            ));
        }
        if self.stacks.size < MIN_STACK_SIZE || self.stacks.size > MAX_STACK_SIZE {
            return Err(err(
                "stack_size",
                &self.stacks.size.to_string(),
                format!("must be between {MIN_STACK_SIZE} and {MAX_STACK_SIZE} bytes"),
            ));
        }
        if self.max_blocking_threads == 0 || self.max_blocking_threads > MAX_BLOCKING_THREADS {
            return Err(err(
                "max_blocking_threads",
                &self.max_blocking_threads.to_string(),
                format!("must be between 1 and {MAX_BLOCKING_THREADS}"),
            ));
        }
        if self.thread_name.contains('\0') {
            return Err(err("thread_name", &self.thread_name, "must not contain a NUL byte"));
        }
        if let Some(signal) = self.dump_signal {
            if signal != libc::SIGUSR1 && signal != libc::SIGUSR2 {
                return Err(err(
                    "dump_signal",
                    &signal.to_string(),
                    "must be SIGUSR1 or SIGUSR2 (another signal has a meaning of its own)",
                ));
            }
        }
        if self.io_park && !self.io_harvest {
            return Err(err(
                "io_park",
                "true",
                "needs io_harvest (an idle worker can wait in the I/O driver only if workers take I/O)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
