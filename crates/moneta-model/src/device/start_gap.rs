//! Start-gap wear leveling with static address randomization (SPEC §1.7;
//! Qureshi et al., MICRO'09; Onyx thesis §2.2).
//!
//! What it models: a region of N = 2^n logical lines stored in N + 1 physical
//! lines, one of which is the spare "gap". Two registers, START and GAP, give
//! the mapping; every G writes the line just below the gap is copied into the
//! gap and the gap moves down one line; when the gap is at line 0 the move
//! copies line N into line 0, the gap wraps to N and START advances by one
//! (mod N). Before start-gap, logical lines pass through a static randomizing
//! bijection derived from a seed, so spatially clustered hot lines are spread
//! over the whole region (MICRO'09 §5).
//!
//! The translation is the one written in the Onyx thesis §2.2:
//! PA = (LA + START) mod N; if PA ≥ GAP then PA + 1.
//!
//! The SPEC's wording "N−1 active lines plus one spare" and the brief's
//! "N logical lines, N + 1 physical lines" describe the same scheme with N
//! counted differently; this module follows MICRO'09: N logical lines (a power
//! of two, so START arithmetic and the randomizer are cheap) plus one gap line.
//!
//! What it leaves out: timing (the controller charges a [`GapMove`] as a line
//! read plus a line write, see `onyx_pcm`), the data itself, the MICRO'09
//! region-based variant and its security extensions, and wear-out (failures).

use crate::kernel::rng::Rng;

/// One gap movement: the controller must copy physical line `from` into
/// physical line `to` (the old gap), as one extra line read and line write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapMove {
    pub from_physical_line: u64,
    pub to_physical_line: u64,
}

/// A static bijection on [0, 2^bits): two rounds of an odd multiply, an add
/// and an xor-shift, all modulo 2^bits. Each step is invertible modulo a power
/// of two (odd multipliers have inverses, `x ^= x >> s` with s ≥ 1 is undone by
/// repeating it), so the whole map is a permutation; it needs no table, which
/// matters because a controller has 2^18 lines and larger.
///
/// MICRO'09 uses a Feistel network or a random invertible binary matrix; any
/// seed-derived static permutation that scatters neighbours serves the same
/// purpose here.
#[derive(Debug, Clone)]
struct Randomizer {
    mask: u64,
    shift: u32,
    multipliers: [u64; 2],
    addends: [u64; 2],
}

impl Randomizer {
    fn new(bits: u32, seed: u64) -> Self {
        // An independent stream so that the randomizer of one controller does
        // not consume numbers another consumer of the same seed sees.
        let mut rng = Rng::stream(seed, 0x5747_4150); // "SGAP"
        let mask = if bits >= 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
        Self {
            mask,
            // Half the width mixes high bits into low bits in one step; at
            // least 1 so the step stays invertible and non-trivial.
            shift: bits.div_ceil(2).max(1),
            multipliers: [rng.next_u64() | 1, rng.next_u64() | 1],
            addends: [rng.next_u64(), rng.next_u64()],
        }
    }

    #[inline]
    fn apply(&self, line: u64) -> u64 {
        let mut x = line & self.mask;
        for round in 0..2 {
            x = x
                .wrapping_mul(self.multipliers[round])
                .wrapping_add(self.addends[round])
                & self.mask;
            x ^= x >> self.shift;
        }
        x
    }
}

/// Start-gap state for one region (one controller's memory in Onyx).
#[derive(Debug, Clone)]
pub struct StartGap {
    /// N: logical lines, a power of two.
    logical_lines: u64,
    /// N − 1, to reduce modulo N with a mask.
    line_mask: u64,
    /// G: writes between gap moves (ψ in MICRO'09).
    gap_interval_writes: u64,
    randomizer: Option<Randomizer>,
    /// START register, in [0, N).
    start: u64,
    /// GAP register: the physical line holding no data, in [0, N].
    gap: u64,
    writes_since_move: u64,
    gap_moves: u64,
    /// Writes per physical line (N + 1 entries), including gap-move copies.
    wear_per_physical_line: Option<Vec<u32>>,
}

impl StartGap {
    /// `logical_lines` must be a power of two (N); physical lines = N + 1 (one gap line).
    pub fn new(
        logical_lines: u64,
        gap_interval_writes: u64,
        randomize: bool,
        seed: u64,
        track_wear: bool,
    ) -> Self {
        assert!(
            logical_lines.is_power_of_two(),
            "start-gap needs a power-of-two number of logical lines, got {logical_lines}"
        );
        assert!(
            gap_interval_writes > 0,
            "start-gap gap interval must be at least one write"
        );
        let physical_lines = logical_lines + 1;
        Self {
            logical_lines,
            line_mask: logical_lines - 1,
            gap_interval_writes,
            randomizer: randomize.then(|| Randomizer::new(logical_lines.trailing_zeros(), seed)),
            start: 0,
            // MICRO'09: the gap starts at the extra line N.
            gap: logical_lines,
            writes_since_move: 0,
            gap_moves: 0,
            wear_per_physical_line: track_wear.then(|| vec![0u32; physical_lines as usize]),
        }
    }

    pub fn logical_lines(&self) -> u64 {
        self.logical_lines
    }

    pub fn physical_lines(&self) -> u64 {
        self.logical_lines + 1
    }

    /// The physical line that currently holds no data.
    pub fn gap_line(&self) -> u64 {
        self.gap
    }

    /// Logical line -> physical line (randomize first, then PA = (LA + START) mod N; if PA >= GAP then PA + 1).
    #[inline]
    pub fn translate(&self, logical_line: u64) -> u64 {
        debug_assert!(
            logical_line < self.logical_lines,
            "logical line {logical_line} out of range"
        );
        let randomized = match &self.randomizer {
            Some(randomizer) => randomizer.apply(logical_line),
            None => logical_line,
        };
        let rotated = (randomized + self.start) & self.line_mask;
        let physical = if rotated >= self.gap {
            rotated + 1
        } else {
            rotated
        };
        debug_assert!(physical != self.gap && physical <= self.logical_lines);
        physical
    }

    /// Count a write to `logical_line` (wear on its physical line); every G writes the gap moves:
    /// returns Some(GapMove) describing the extra line copy the controller must perform.
    pub fn record_write(&mut self, logical_line: u64) -> Option<GapMove> {
        let physical = self.translate(logical_line);
        self.add_wear(physical);
        self.writes_since_move += 1;
        if self.writes_since_move < self.gap_interval_writes {
            return None;
        }
        self.writes_since_move = 0;
        Some(self.move_gap())
    }

    /// Gap moves so far; each is one extra line write.
    pub fn gap_moves(&self) -> u64 {
        self.gap_moves
    }

    /// Per-physical-line write counts (including gap-move copies) when track_wear is on.
    pub fn wear(&self) -> Option<&[u32]> {
        self.wear_per_physical_line.as_deref()
    }

    /// MICRO'09 Figure 4: copy the line below the gap into the gap; at the
    /// bottom, copy line N into line 0, wrap the gap to N and advance START.
    fn move_gap(&mut self) -> GapMove {
        let gap_move = if self.gap == 0 {
            let gap_move = GapMove {
                from_physical_line: self.logical_lines,
                to_physical_line: 0,
            };
            self.gap = self.logical_lines;
            self.start = (self.start + 1) & self.line_mask;
            gap_move
        } else {
            let gap_move = GapMove {
                from_physical_line: self.gap - 1,
                to_physical_line: self.gap,
            };
            self.gap -= 1;
            gap_move
        };
        self.gap_moves += 1;
        self.add_wear(gap_move.to_physical_line);
        gap_move
    }

    #[inline]
    fn add_wear(&mut self, physical_line: u64) {
        if let Some(wear) = &mut self.wear_per_physical_line {
            let count = &mut wear[physical_line as usize];
            *count = count.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::rng::Rng;
    use proptest::prelude::*;

    fn mapping(start_gap: &StartGap) -> Vec<u64> {
        (0..start_gap.logical_lines())
            .map(|line| start_gap.translate(line))
            .collect()
    }

    /// Every logical line maps to a distinct physical line, and none maps to the gap.
    fn assert_bijection_minus_gap(start_gap: &StartGap) {
        let mut seen = vec![false; start_gap.physical_lines() as usize];
        for physical in mapping(start_gap) {
            assert!(physical < start_gap.physical_lines());
            assert_ne!(
                physical,
                start_gap.gap_line(),
                "a logical line maps onto the gap"
            );
            assert!(
                !seen[physical as usize],
                "two logical lines share physical line {physical}"
            );
            seen[physical as usize] = true;
        }
    }

    #[test]
    fn translation_by_hand_on_four_lines() {
        // N = 4, G = 1, no randomization: every write moves the gap.
        let mut start_gap = StartGap::new(4, 1, false, 0, false);
        assert_eq!(start_gap.physical_lines(), 5);
        // START = 0, GAP = 4: identity.
        assert_eq!(mapping(&start_gap), vec![0, 1, 2, 3]);
        // Move 1: copy 3 -> 4, GAP = 3; LA 3 -> PA 3 >= 3 -> 4.
        assert_eq!(
            start_gap.record_write(0),
            Some(GapMove {
                from_physical_line: 3,
                to_physical_line: 4
            })
        );
        assert_eq!(mapping(&start_gap), vec![0, 1, 2, 4]);
        // Moves 2..4: the gap walks down to 0.
        assert_eq!(
            start_gap.record_write(0),
            Some(GapMove {
                from_physical_line: 2,
                to_physical_line: 3
            })
        );
        assert_eq!(mapping(&start_gap), vec![0, 1, 3, 4]);
        start_gap.record_write(0);
        start_gap.record_write(0);
        assert_eq!(start_gap.gap_line(), 0);
        assert_eq!(mapping(&start_gap), vec![1, 2, 3, 4]);
        // Move 5: copy line N = 4 into line 0, GAP wraps to 4, START = 1:
        // LA 3 -> (3 + 1) mod 4 = 0.
        assert_eq!(
            start_gap.record_write(0),
            Some(GapMove {
                from_physical_line: 4,
                to_physical_line: 0
            })
        );
        assert_eq!(start_gap.gap_line(), 4);
        assert_eq!(mapping(&start_gap), vec![1, 2, 3, 0]);
        // Move 6: copy 3 -> 4, GAP = 3; LA 2 -> 3 >= 3 -> 4.
        start_gap.record_write(0);
        assert_eq!(mapping(&start_gap), vec![1, 2, 4, 0]);
        assert_eq!(start_gap.gap_moves(), 6);
    }

    #[test]
    fn gap_moves_only_every_g_writes() {
        let mut start_gap = StartGap::new(8, 3, false, 0, false);
        assert_eq!(start_gap.record_write(1), None);
        assert_eq!(start_gap.record_write(1), None);
        assert!(start_gap.record_write(1).is_some());
        assert_eq!(start_gap.gap_moves(), 1);
    }

    #[test]
    fn randomizer_is_a_permutation_and_scatters_neighbours() {
        for bits in 0..=10u32 {
            let randomizer = Randomizer::new(bits, 42);
            let lines = 1u64 << bits;
            let mut seen = vec![false; lines as usize];
            for line in 0..lines {
                let image = randomizer.apply(line);
                assert!(image < lines);
                assert!(!seen[image as usize]);
                seen[image as usize] = true;
            }
        }
        // The first 16 lines of a 1024-line region should not stay clustered.
        let randomizer = Randomizer::new(10, 7);
        let images: Vec<u64> = (0..16).map(|line| randomizer.apply(line)).collect();
        let spread = images.iter().max().unwrap() - images.iter().min().unwrap();
        assert!(
            spread > 256,
            "randomized neighbours still clustered: {images:?}"
        );
    }

    #[test]
    fn uniform_writes_cost_one_extra_write_per_g() {
        let lines = 256;
        let gap_interval_writes = 100;
        let mut start_gap = StartGap::new(lines, gap_interval_writes, true, 1, true);
        let mut rng = Rng::new(3);
        let writes = 100_000u64;
        for _ in 0..writes {
            start_gap.record_write(rng.below(lines));
        }
        assert_eq!(start_gap.gap_moves(), writes / gap_interval_writes);
        let total_wear: u64 = start_gap.wear().unwrap().iter().map(|&w| w as u64).sum();
        assert_eq!(total_wear, writes + writes / gap_interval_writes);
        let overhead = start_gap.gap_moves() as f64 / writes as f64;
        assert!((overhead - 0.01).abs() < 1e-12);
    }

    /// max / mean of per-line wear.
    fn wear_imbalance(wear: &[u32]) -> f64 {
        let max = *wear.iter().max().unwrap() as f64;
        let mean = wear.iter().map(|&w| w as f64).sum::<f64>() / wear.len() as f64;
        max / mean
    }

    #[test]
    fn randomized_start_gap_spreads_a_hot_spot() {
        // 90% of writes go to a contiguous 10% of the lines (a hot region).
        let lines = 1024u64;
        let hot_lines = 102u64;
        let writes = 2_000_000u64;
        let run = |gap_interval_writes: u64, randomize: bool| {
            let mut start_gap = StartGap::new(lines, gap_interval_writes, randomize, 11, true);
            let mut rng = Rng::new(5);
            for _ in 0..writes {
                let line = if rng.below(10) < 9 {
                    rng.below(hot_lines)
                } else {
                    rng.below(lines)
                };
                start_gap.record_write(line);
            }
            wear_imbalance(start_gap.wear().unwrap())
        };
        // "No leveling": a gap interval longer than the run never moves the gap.
        let unleveled = run(u64::MAX, false);
        let leveled = run(8, true);
        assert!(
            unleveled > 7.0,
            "hot spot should concentrate wear, max/mean = {unleveled}"
        );
        assert!(
            leveled < 1.6,
            "randomized start-gap should spread wear, max/mean = {leveled}"
        );
        eprintln!("hot spot max/mean: unleveled {unleveled:.2}, leveled {leveled:.2}");
        assert!(leveled * 4.0 < unleveled);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// After any sequence of writes (and so any number of gap moves,
        /// including several full rotations of START on small regions) the
        /// mapping is a bijection onto the physical lines minus the gap, and
        /// data follows it: applying each GapMove as a copy to a simulated
        /// array keeps every logical line's latest value readable.
        #[test]
        fn mapping_stays_a_bijection_and_data_follows_it(
            bits in 0u32..6,
            gap_interval_writes in 1u64..5,
            randomize in any::<bool>(),
            seed in any::<u64>(),
            writes in prop::collection::vec(any::<u64>(), 0..1500),
        ) {
            let lines = 1u64 << bits;
            let mut start_gap = StartGap::new(lines, gap_interval_writes, randomize, seed, true);
            // The array holds, per physical line, the value last stored there.
            let mut array = vec![u64::MAX; start_gap.physical_lines() as usize];
            let mut expected = vec![0u64; lines as usize];
            for line in 0..lines {
                expected[line as usize] = line;
                array[start_gap.translate(line) as usize] = line;
            }
            for (step, raw_line) in writes.iter().enumerate() {
                let line = raw_line & (lines - 1);
                let value = lines + step as u64;
                array[start_gap.translate(line) as usize] = value;
                expected[line as usize] = value;
                if let Some(gap_move) = start_gap.record_write(line) {
                    prop_assert_ne!(gap_move.from_physical_line, gap_move.to_physical_line);
                    array[gap_move.to_physical_line as usize] = array[gap_move.from_physical_line as usize];
                }
                assert_bijection_minus_gap(&start_gap);
                for logical in 0..lines {
                    prop_assert_eq!(array[start_gap.translate(logical) as usize], expected[logical as usize]);
                }
            }
            let total_wear: u64 = start_gap.wear().unwrap().iter().map(|&w| w as u64).sum();
            prop_assert_eq!(total_wear, writes.len() as u64 + start_gap.gap_moves());
        }
    }
}
