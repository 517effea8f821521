//! The seeded random-program fuzzers' shared parts
//! (`reviews/review27.rs`, `reviews/review29.rs`): a xorshift
//! generator and the environment knobs of their long runs.

/// A small xorshift64 generator: the same seed gives the same program.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
        if r.0 == 0 {
            r.0 = 1;
        }
        for _ in 0..4 {
            r.next();
        }
        r
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..n` (`0` for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True `percent` times in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A generator of its own for a sub-program, seeded from this one.
    pub fn fork(&mut self) -> Rng {
        Rng::new(self.next())
    }
}

/// A long run's knob (`FUZZ_SEEDS`, `FUZZ_START`), or `default` when unset
/// or not a number.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Whether a panic payload is one a fuzzer planned.
pub type Planned = fn(&(dyn std::any::Any + Send)) -> bool;

/// Keep a fuzzer's planned panics (those `planned` recognizes by their
/// payload) out of the output; other panics print as usual. One hook per
/// test process serves every predicate registered.
pub fn quiet_panics(planned: Planned) {
    // One hook for the whole binary (several files' fuzzers share it when
    // they are modules of one test binary): it stays quiet for a payload
    // any registered predicate plans.
    static PLANNED: std::sync::Mutex<Vec<Planned>> = std::sync::Mutex::new(Vec::new());
    static ONCE: std::sync::Once = std::sync::Once::new();
    {
        let mut list = PLANNED.lock().unwrap_or_else(|e| e.into_inner());
        if !list.contains(&planned) {
            list.push(planned);
        }
    }
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let list = PLANNED.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if list.iter().any(|p| p(info.payload())) {
                return;
            }
            default(info);
        }));
    });
}

/// Run `program(seed, kind, shutdown)` for each seed, each within 60 s and
/// all within `secs`; a failing seed is named on stderr before its panic
/// goes on (`FUZZ_VERBOSE` names every seed first).
pub fn run_seeds<K: std::fmt::Debug + Copy + Send + 'static>(
    seeds: std::ops::Range<u64>,
    kind: K,
    shutdown: bool,
    secs: u64,
    program: fn(u64, K, bool),
) {
    super::within(secs, move || {
        for seed in seeds {
            if std::env::var_os("FUZZ_VERBOSE").is_some() {
                eprintln!("seed {seed} {kind:?} shutdown={shutdown}");
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                super::within(60, move || program(seed, kind, shutdown))
            }));
            if let Err(e) = r {
                eprintln!("FAILED seed {seed} {kind:?} shutdown={shutdown}");
                std::panic::resume_unwind(e);
            }
        }
    });
}
