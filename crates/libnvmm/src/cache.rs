//! The DRAM cache's bookkeeping (SPEC §7: set-associative, LRU, blocks the
//! size of a flash page). The blocks themselves are the region's resident
//! pages; this holds which are resident and dirty and each set's recency
//! order. User space sees only misses and first writes (hits are plain
//! loads and stores, which is the point), so "LRU" orders blocks by their
//! last fill or dirtying: within a set it is FIFO-with-dirtying, not the
//! hardware's true LRU. The region keeps one way per set free (it evicts
//! during a fill's flash wait, or right after the fill), so a miss does not
//! wait for an eviction.

use crate::error::{ErrorKind, NvmmError, Result};
use crate::table::try_filled;

pub const RESIDENT: u8 = 1;
pub const DIRTY: u8 = 2;

pub struct Cache {
    state: Vec<u8>,
    sets: Vec<Vec<u64>>,
    ways: usize,
    resident: u64,
}

impl Cache {
    /// A cache of `capacity_blocks` in sets of `ways` (0: one fully
    /// associative set) over a region of `region_blocks`. A budget larger
    /// than the region is the region: every block fits, and no memory is
    /// set aside for blocks that cannot exist.
    pub fn new(region_blocks: u64, capacity_blocks: u64, ways: usize) -> Result<Cache> {
        let capacity = capacity_blocks.clamp(1, region_blocks.max(1));
        let capacity = usize::try_from(capacity).map_err(|_| {
            NvmmError::new(
                ErrorKind::InvalidArgument,
                "the DRAM budget exceeds the address space",
            )
        })?;
        let ways = if ways == 0 || ways > capacity {
            capacity
        } else {
            ways
        };
        let n_sets = (capacity / ways).max(1);
        let refused = || {
            NvmmError::new(
                ErrorKind::Exhausted,
                format!("cannot allocate {n_sets} cache sets of {ways} ways"),
            )
        };
        let mut sets = Vec::new();
        sets.try_reserve_exact(n_sets).map_err(|_| refused())?;
        for _ in 0..n_sets {
            let mut set = Vec::new();
            set.try_reserve_exact(ways).map_err(|_| refused())?;
            sets.push(set);
        }
        Ok(Cache {
            state: try_filled(region_blocks, 0u8, "the cache's block states")?,
            sets,
            ways,
            resident: 0,
        })
    }

    pub fn capacity_blocks(&self) -> u64 {
        (self.sets.len() * self.ways) as u64
    }
    pub fn ways(&self) -> usize {
        self.ways
    }
    pub fn resident(&self) -> u64 {
        self.resident
    }

    fn set_of(&self, block: u64) -> usize {
        (block % self.sets.len() as u64) as usize
    }

    pub fn state(&self, block: u64) -> u8 {
        self.state[block as usize]
    }
    pub fn is_resident(&self, block: u64) -> bool {
        self.state(block) & RESIDENT != 0
    }
    pub fn is_dirty(&self, block: u64) -> bool {
        self.state(block) & DIRTY != 0
    }

    /// The block to evict before `block` can be filled, if its set is full.
    pub fn victim_for(&self, block: u64) -> Option<u64> {
        let set = &self.sets[self.set_of(block)];
        (set.len() >= self.ways).then(|| set[0])
    }

    /// The block to evict now so that `block`'s set still has a free way
    /// after `block` is filled (None with one way per set, which cannot
    /// keep one free).
    pub fn victim_after_fill(&self, block: u64) -> Option<u64> {
        let set = &self.sets[self.set_of(block)];
        (self.ways > 1 && set.len() + 1 >= self.ways).then(|| set[0])
    }

    pub fn insert(&mut self, block: u64, dirty: bool) {
        debug_assert!(!self.is_resident(block));
        let s = self.set_of(block);
        assert!(self.sets[s].len() < self.ways, "set {s} overfilled");
        self.sets[s].push(block);
        self.state[block as usize] = RESIDENT | if dirty { DIRTY } else { 0 };
        self.resident += 1;
    }

    pub fn remove(&mut self, block: u64) {
        let s = self.set_of(block);
        if let Some(i) = self.sets[s].iter().position(|&b| b == block) {
            self.sets[s].remove(i);
            self.resident -= 1;
        }
        self.state[block as usize] = 0;
    }

    /// Move `block` to the most recently used end of its set.
    pub fn touch(&mut self, block: u64) {
        let s = self.set_of(block);
        if let Some(i) = self.sets[s].iter().position(|&b| b == block) {
            self.sets[s].remove(i);
            self.sets[s].push(block);
        }
    }

    pub fn set_dirty(&mut self, block: u64, dirty: bool) {
        debug_assert!(self.is_resident(block));
        if dirty {
            self.state[block as usize] |= DIRTY;
        } else {
            self.state[block as usize] &= !DIRTY;
        }
    }

    pub fn resident_blocks(&self) -> Vec<u64> {
        self.sets.iter().flatten().copied().collect()
    }

    pub fn dirty_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .sets
            .iter()
            .flatten()
            .copied()
            .filter(|&b| self.is_dirty(b))
            .collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_evict_their_oldest_block() {
        let mut c = Cache::new(64, 4, 2).unwrap(); // 2 sets of 2 ways
        assert_eq!(c.capacity_blocks(), 4);
        c.insert(0, false);
        c.insert(2, true);
        assert_eq!(c.victim_for(1), None, "block 1 maps to the other set");
        assert_eq!(c.victim_for(4), Some(0));
        assert_eq!(c.victim_after_fill(1), None, "the other set is empty");
        c.touch(0);
        assert_eq!(c.victim_for(4), Some(2));
        assert_eq!(c.dirty_blocks(), vec![2]);
        c.remove(2);
        c.insert(4, false);
        assert_eq!(c.resident(), 2);
        assert!(!c.is_resident(2) && c.is_resident(4));
    }
}
