//! libnvmm's DRAM cache bookkeeping (SPEC §7: set-associative, LRU, blocks
//! the size of a flash page) on the NVMM model's own cache
//! (`moneta_model::nvmm::cache::BlockCache`, issue 24: one cache policy),
//! which the miss path both faces share (`moneta_model::nvmm::miss_path`)
//! fills and evicts. The blocks themselves are the region's resident pages;
//! this holds which are resident and dirty and each set's recency order.
//! User space sees only misses and first writes (hits are plain loads and
//! stores, which is the point), so recency is by fill and first store:
//! within a set, FIFO-with-dirtying rather than the hardware's true LRU.

use crate::error::{ErrorKind, NvmmError, Result};
use moneta_model::nvmm::cache::BlockCache;

pub struct Cache {
    blocks: BlockCache,
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
    /// How many blocks are resident (a count over the ways: for stats).
    pub fn resident(&self) -> u64 {
        self.blocks.resident().count() as u64
    }

    /// The cache itself, for the miss path to choose victims and fill.
    pub fn blocks_mut(&mut self) -> &mut BlockCache {
        &mut self.blocks
    }

    pub fn is_resident(&self, block: u64) -> bool {
        self.blocks.contains(block)
    }
    pub fn is_dirty(&self, block: u64) -> bool {
        self.blocks
            .find(block)
            .is_some_and(|w| self.blocks.way(w).dirty)
    }

    pub fn remove(&mut self, block: u64) {
        self.blocks.remove(block);
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
        for (block, dirty) in [(0, false), (2, true)] {
            let (w, old) = c.blocks_mut().victim(block);
            assert_eq!(old.block(), None);
            c.blocks_mut().install(w, block, 0, dirty);
        }
        assert_eq!(c.blocks_mut().victim(1).1.block(), None, "the other set");
        assert_eq!(c.blocks_mut().victim(4).1.block(), Some(0));
        c.touch(0);
        assert_eq!(c.blocks_mut().victim(4).1.block(), Some(2));
        assert_eq!(c.dirty_blocks(), vec![2]);
        c.remove(2);
        assert_eq!(c.resident(), 1);
        assert!(!c.is_resident(2) && c.is_resident(0));
        assert!(
            Cache::new(1 << 20, u64::MAX, 0).is_ok(),
            "clamped to the region"
        );
    }
}
