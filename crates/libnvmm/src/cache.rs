//! libnvmm's DRAM cache bookkeeping (SPEC §7: set-associative, LRU, blocks
//! the size of a flash page) on the NVMM model's own cache
//! (`moneta_model::nvmm::cache::BlockCache`, issue 24: one cache policy).
//! The blocks themselves are the region's resident pages; this holds which
//! are resident and dirty and each set's recency order. User space sees
//! only misses and first writes (hits are plain loads and stores, which is
//! the point), so recency is by fill and first store: within a set,
//! FIFO-with-dirtying rather than the hardware's true LRU. The region
//! keeps one way per set free (it evicts during a fill's flash wait, or
//! right after the fill), so a miss does not wait for an eviction.

use crate::error::{ErrorKind, NvmmError, Result};
use moneta_model::nvmm::cache::BlockCache;

pub struct Cache {
    blocks: BlockCache,
    resident: u64,
}

impl Cache {
    /// A cache of `capacity_blocks` in sets of `ways` (0: one fully
    /// associative set) over a region of `region_blocks`. A budget larger
    /// than the region is the region: every block fits, and no memory is
    /// set aside for blocks that cannot exist.
    pub fn new(region_blocks: u64, capacity_blocks: u64, ways: usize) -> Result<Cache> {
        let capacity = capacity_blocks.clamp(1, region_blocks.max(1));
        let ways = if ways == 0 || ways as u64 > capacity {
            capacity
        } else {
            ways as u64
        };
        let ways = u32::try_from(ways).map_err(|_| {
            NvmmError::new(
                ErrorKind::InvalidArgument,
                format!("{ways} ways in one set are more than a cache can search"),
            )
        })?;
        let sets = (capacity / u64::from(ways)).max(1);
        Ok(Cache {
            blocks: BlockCache::try_new(sets * u64::from(ways), ways)?,
            resident: 0,
        })
    }

    /// Bookkeeping bytes of a cache of `capacity_blocks` (at most the
    /// region's blocks).
    pub fn memory_bytes(capacity_blocks: u64) -> u64 {
        capacity_blocks.saturating_mul(BlockCache::BYTES_PER_BLOCK)
    }

    pub fn capacity_blocks(&self) -> u64 {
        self.blocks.blocks()
    }
    pub fn ways(&self) -> usize {
        self.blocks.ways()
    }
    pub fn resident(&self) -> u64 {
        self.resident
    }

    pub fn is_resident(&self, block: u64) -> bool {
        self.blocks.contains(block)
    }
    pub fn is_dirty(&self, block: u64) -> bool {
        self.blocks
            .find(block)
            .is_some_and(|w| self.blocks.way(w).dirty)
    }

    /// The block to evict before `block` can be filled, if its set is full.
    pub fn victim_for(&self, block: u64) -> Option<u64> {
        self.blocks.victim(block).1.block()
    }

    /// The block to evict now so that `block`'s set still has a free way
    /// after `block` is filled (None with one way per set, which cannot
    /// keep one free).
    pub fn victim_after_fill(&self, block: u64) -> Option<u64> {
        if self.ways() > 1 && self.blocks.occupied(block) + 1 >= self.ways() {
            let lru = self.blocks.next_victim(block, usize::MAX)?;
            return self.blocks.way(lru).block();
        }
        None
    }

    pub fn insert(&mut self, block: u64, dirty: bool) {
        let (w, old) = self.blocks.victim(block);
        assert!(old.block().is_none(), "set of block {block} overfilled");
        self.blocks.install(w, block, 0, dirty);
        self.resident += 1;
    }

    pub fn remove(&mut self, block: u64) {
        if self.blocks.remove(block) {
            self.resident -= 1;
        }
    }

    /// Make `block` the most recently used of its set.
    pub fn touch(&mut self, block: u64) {
        self.blocks.lookup(block);
    }

    pub fn set_dirty(&mut self, block: u64, dirty: bool) {
        let w = self.blocks.find(block).expect("a resident block");
        self.blocks.way_mut(w).dirty = dirty;
    }

    pub fn resident_blocks(&self) -> Vec<u64> {
        self.blocks.resident().filter_map(|w| w.block()).collect()
    }

    pub fn dirty_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .blocks
            .resident()
            .filter(|w| w.dirty)
            .filter_map(|w| w.block())
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
        assert_eq!(c.victim_after_fill(4), Some(0));
        c.touch(0);
        assert_eq!(c.victim_for(4), Some(2));
        assert_eq!(c.dirty_blocks(), vec![2]);
        c.remove(2);
        c.insert(4, false);
        assert_eq!(c.resident(), 2);
        assert!(!c.is_resident(2) && c.is_resident(4));
        assert!(
            Cache::new(1 << 20, u64::MAX, 0).is_ok(),
            "clamped to the region"
        );
    }
}
