//! Latency statistics with bounded memory and bounded error.
//!
//! A log-linear (HDR-style) histogram: values below 1024 ns have a bucket
//! each (exact); above, every power of two is split into 1024 equal
//! sub-buckets, so a bucket is never wider than 1/1024 of its lower bound.
//! A percentile reports the middle of its bucket, clamped to the exact
//! minimum and maximum: its relative error is below 1/2048 (0.05%) of the
//! sample at that rank. The count, mean, minimum and maximum are exact.
//!
//! The emulator's completion path records into it, so `record` is O(1) and
//! never allocates: the buckets (55 × 1024 counters, 440 KiB) are allocated
//! once, at construction.

use crate::units::Ns;

/// Sub-buckets per power of two: 2^SUB_BITS.
const SUB_BITS: u32 = 10;
const SUB: usize = 1 << SUB_BITS;
/// Values 0..SUB have one bucket each; then one row of SUB buckets for each
/// exponent SUB_BITS..=63.
const BUCKETS: usize = SUB * (64 - SUB_BITS as usize + 1);

#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    buckets: Box<[u64]>,
    count: u64,
    sum_ns: u128,
    min_ns: Ns,
    max_ns: Ns,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    pub fn new() -> Self {
        Self {
            buckets: vec![0; BUCKETS].into_boxed_slice(),
            count: 0,
            sum_ns: 0,
            min_ns: Ns::MAX,
            max_ns: 0,
        }
    }

    #[inline]
    fn index(v: Ns) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = exp - SUB_BITS;
        let mantissa = (v >> shift) as usize - SUB; // 0..SUB
        (shift as usize + 1) * SUB + mantissa
    }

    /// The smallest value in a bucket, and the bucket's width.
    fn bounds(index: usize) -> (Ns, Ns) {
        if index < SUB {
            return (index as Ns, 1);
        }
        let shift = (index / SUB - 1) as u32;
        let mantissa = (index % SUB + SUB) as u64;
        (mantissa << shift, 1 << shift)
    }

    #[inline]
    pub fn record(&mut self, v: Ns) {
        self.buckets[Self::index(v)] += 1;
        self.count += 1;
        self.sum_ns += v as u128;
        self.min_ns = self.min_ns.min(v);
        self.max_ns = self.max_ns.max(v);
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64
        }
    }

    /// The smallest sample (0 when empty).
    pub fn min_ns(&self) -> Ns {
        if self.count == 0 {
            0
        } else {
            self.min_ns
        }
    }

    pub fn max_ns(&self) -> Ns {
        self.max_ns
    }

    /// The sample of rank ⌈q·count⌉ in sorted order (nearest rank), to
    /// within 0.05%; 0 when empty.
    pub fn percentile_ns(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (lo, width) = Self::bounds(i);
                let middle = lo as f64 + (width - 1) as f64 / 2.0;
                return middle.clamp(self.min_ns as f64, self.max_ns as f64);
            }
        }
        unreachable!("the buckets hold count samples")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Nearest-rank percentile of sorted samples: the definition
    /// `percentile_ns` approximates.
    fn exact(sorted: &[u64], q: f64) -> f64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1] as f64
    }

    fn check_against_sorted(samples: &[u64]) -> Result<(), String> {
        let mut h = LatencyHistogram::new();
        for &v in samples {
            h.record(v);
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        for q in [0.0, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1.0] {
            let (got, want) = (h.percentile_ns(q), exact(&sorted, q));
            let error = if want == 0.0 {
                got
            } else {
                (got - want).abs() / want
            };
            if error > 0.001 {
                return Err(format!("q={q}: got {got}, exact {want}"));
            }
        }
        if h.max_ns() != *sorted.last().unwrap() || h.min_ns() != sorted[0] {
            return Err("min/max not exact".into());
        }
        let mean = samples.iter().map(|&v| v as f64).sum::<f64>() / samples.len() as f64;
        if (h.mean_ns() - mean).abs() > mean * 1e-9 {
            return Err(format!("mean {} != {mean}", h.mean_ns()));
        }
        Ok(())
    }

    /// xorshift64*: samples from a printed seed, without a global RNG.
    fn samples(seed: u64, n: usize, spread_bits: u32) -> Vec<u64> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
                // Log-uniform over 2^0 .. 2^spread_bits.
                let bits = (r >> 58) as u32 % (spread_bits + 1);
                (r & ((1u64 << bits) - 1).max(1)) | (1 << bits >> 1)
            })
            .collect()
    }

    #[test]
    fn percentiles_within_a_tenth_of_a_percent_of_sorted_samples() {
        // A fixed seed, printed so a failure reproduces; the proptest below
        // explores others.
        let seed = 0x5eed_2026_u64;
        eprintln!("seed {seed:#x}");
        for spread in [8, 20, 40, 63] {
            check_against_sorted(&samples(seed, 100_000, spread))
                .unwrap_or_else(|e| panic!("seed {seed:#x} spread {spread}: {e}"));
        }
        // The user's case: a narrow distribution near 19 µs.
        let narrow: Vec<u64> = (0..10_000).map(|i| 18_500 + (i * 37) % 1_100).collect();
        check_against_sorted(&narrow).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn percentiles_match_sorted_vec(seed in any::<u64>(), n in 1usize..5_000, spread in 1u32..64) {
            let s = samples(seed, n, spread);
            prop_assert!(check_against_sorted(&s).is_ok(), "seed {seed:#x} n {n} spread {spread}: {:?}", check_against_sorted(&s));
        }

        #[test]
        fn merge_equals_recording_both(a in proptest::collection::vec(0u64..1 << 40, 1..500), b in proptest::collection::vec(0u64..1 << 40, 1..500)) {
            let (mut ha, mut hb, mut both) = (LatencyHistogram::new(), LatencyHistogram::new(), LatencyHistogram::new());
            a.iter().for_each(|&v| { ha.record(v); both.record(v) });
            b.iter().for_each(|&v| { hb.record(v); both.record(v) });
            ha.merge(&hb);
            for q in [0.5, 0.99, 0.999] {
                prop_assert_eq!(ha.percentile_ns(q), both.percentile_ns(q));
            }
            prop_assert_eq!((ha.count(), ha.min_ns(), ha.max_ns()), (both.count(), both.min_ns(), both.max_ns()));
        }
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let h = LatencyHistogram::new();
        assert_eq!(
            (h.percentile_ns(0.5), h.mean_ns(), h.min_ns(), h.max_ns()),
            (0.0, 0.0, 0, 0)
        );
    }

    #[test]
    fn bucket_index_is_monotonic_and_bounds_contain_the_value() {
        let in_bucket = |v: u64| {
            let i = LatencyHistogram::index(v);
            assert!(i < BUCKETS);
            let (lo, width) = LatencyHistogram::bounds(i);
            assert!(
                lo <= v && v - lo < width,
                "{v} in bucket {i} = [{lo}, +{width})"
            );
            i
        };
        let mut last = 0;
        for v in (0..2_000_000u64).step_by(7) {
            let i = in_bucket(v);
            assert!(i >= last);
            last = i;
        }
        for v in (10..64).map(|b| (1u64 << b) - 1).chain([u64::MAX]) {
            in_bucket(v);
        }
    }
}
