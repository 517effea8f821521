//! The seeded random-program fuzzers' shared parts
//! (`adversarial_review27.rs`, `adversarial_review29.rs`): a xorshift
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
