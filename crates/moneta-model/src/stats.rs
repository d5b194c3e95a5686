//! Latency statistics with bounded memory.
//!
//! A log-linear histogram (64 sub-buckets per power of two: relative error
//! below 1.6%) gives percentiles; the mean and maximum are exact.

use crate::units::Ns;

const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;

#[derive(Debug, Clone)]
pub struct LatencyHistogram {
    buckets: Vec<u64>,
    count: u64,
    sum_ns: u128,
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
            buckets: vec![0; SUB * 64],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }

    fn index(v: Ns) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = exp - SUB_BITS;
        let mantissa = (v >> shift) as usize - SUB; // 0..SUB
        (shift as usize + 1) * SUB + mantissa
    }

    /// Lower bound of a bucket's values.
    fn value(index: usize) -> Ns {
        if index < SUB {
            return index as Ns;
        }
        let shift = (index / SUB - 1) as u32;
        let mantissa = (index % SUB + SUB) as u64;
        mantissa << shift
    }

    #[inline]
    pub fn record(&mut self, v: Ns) {
        self.buckets[Self::index(v)] += 1;
        self.count += 1;
        self.sum_ns += v as u128;
        self.max_ns = self.max_ns.max(v);
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
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

    pub fn max_ns(&self) -> Ns {
        self.max_ns
    }

    /// The value below which a fraction `q` of samples lie (bucket midpoint).
    pub fn percentile_ns(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let lo = Self::value(i) as f64;
                let hi = Self::value(i + 1) as f64;
                return ((lo + hi) / 2.0).min(self.max_ns as f64);
            }
        }
        self.max_ns as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_within_two_percent() {
        let mut h = LatencyHistogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        for (q, expect) in [(0.5, 500_000.0), (0.99, 990_000.0)] {
            let got = h.percentile_ns(q);
            assert!((got - expect).abs() / expect < 0.02, "p{q}: {got}");
        }
        assert!((h.mean_ns() - 500_005.0).abs() < 1e-6);
        assert_eq!(h.max_ns(), 1_000_000);
    }

    #[test]
    fn bucket_index_is_monotonic() {
        let mut last = 0;
        for v in (0..1_000_000u64).step_by(7) {
            let i = LatencyHistogram::index(v);
            assert!(i >= last);
            assert!(LatencyHistogram::value(i) <= v);
            last = i;
        }
    }
}
