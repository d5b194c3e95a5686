//! Seeded randomness: xoshiro256** seeded through splitmix64.
//!
//! Implemented here (30 lines) rather than taken from a crate so that the
//! stream for a given seed can never change under a dependency upgrade: the
//! same seed reproduces a run to the last digit (STYLE.md rule 3).

/// A small, fast, deterministic generator. Not for cryptography.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

/// SplitMix64 (Steele, Lea and Flood 2014): advances `state` by the golden
/// gamma and returns its mix. The one copy: it seeds [`Rng`] here and is the
/// whole generator of the torture schedules' seeds, libnvmm's workloads and
/// `nvmm-gups`.
#[inline]
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut state = seed;
        let s = [
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
            splitmix64(&mut state),
        ];
        Self { s }
    }

    /// An independent stream derived from this seed and a stream number, so
    /// that adding a consumer does not shift the numbers others see.
    pub fn stream(seed: u64, stream: u64) -> Self {
        Self::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..bound` (bound > 0), by multiply-shift (Lemire).
    #[inline]
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        ((self.next_u64() as u128 * bound as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Fill `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A randomized test's seed: the environment variable `var` if set, else
/// the clock; printed (stderr) with how to run the test again with it.
pub fn seed_from_env(var: &str) -> u64 {
    seed_choice(var, None)
}

/// A test's seed that is fixed unless asked otherwise: the environment
/// variable `var` if it is a number, the clock if it says `random`, else
/// `fixed` (so that a test run in CI can never fail by chance; the random
/// hunt is asked for). Printed (stderr) with how to run it again.
pub fn seed_fixed_unless_env(var: &str, fixed: u64) -> u64 {
    seed_choice(var, Some(fixed))
}

fn seed_choice(var: &str, fixed: Option<u64>) -> u64 {
    let set = std::env::var(var).ok();
    let clock = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    };
    let seed = match (set.as_deref().map(str::trim), fixed) {
        (Some(s), _) if s.parse::<u64>().is_ok() => s.parse().expect("checked"),
        (Some("random"), _) | (_, None) => clock(),
        (_, Some(f)) => f,
    };
    eprintln!("seed {seed} ({var}={seed} replays it)");
    seed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = Rng::new(7);
        let mut seen = [false; 10];
        for _ in 0..10_000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}
