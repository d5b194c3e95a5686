//! A set-associative LRU cache of large blocks (SPEC §7 "DRAM cache"):
//! NVMM's DRAM cache (flash-page-sized blocks, tags in DRAM), and, with OS
//! pages as blocks and many ways, the SSD system's page cache; libnvmm's
//! DRAM cache keeps its sets and recency here too (issue 24: one cache
//! policy), seeing only the fills and first stores user space can see.
//!
//! The cache holds only metadata: which block each way holds, when it was
//! last used, whether it is dirty, and when its fill completes. A block is
//! installed at the moment its miss is handled, with `ready_ns` in the
//! future; an access that finds it before then waits until `ready_ns` (the
//! miss-status holding register of a real controller, and how prefetched
//! blocks in flight are found). Timing of the tag and data accesses is the
//! caller's (`dram.rs`): the tags live in DRAM.

use crate::units::Ns;

/// One way of a set.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Way {
    /// Block number + 1; 0 is an empty way.
    tag: u64,
    last_use: u64,
    pub ready_ns: Ns,
    pub dirty: bool,
    /// Brought in ahead of use and not touched since (prefetch, readahead).
    pub prefetched: bool,
}

impl Way {
    pub fn block(&self) -> Option<u64> {
        self.tag.checked_sub(1)
    }
}

/// Which way (index into the whole cache) a lookup found or chose.
pub type WayIndex = usize;

#[derive(Clone, Debug)]
pub struct BlockCache {
    sets: u64,
    ways: usize,
    slots: Vec<Way>,
    /// `slots[i].tag` again, packed: a set's tags are searched on every
    /// access, and 16 of them fit two CPU cache lines (16 `Way`s take 8).
    tags: Vec<u64>,
    tick: u64,
}

impl BlockCache {
    /// `blocks` must be a multiple of `ways` (checked by the configuration).
    pub fn new(blocks: u64, ways: u32) -> Self {
        Self::try_new(blocks, ways).expect("a cache the configuration allows")
    }

    /// As [`BlockCache::new`], with an allocation the system refuses as an
    /// error instead of an abort.
    pub fn try_new(blocks: u64, ways: u32) -> Result<Self, super::page_table::TableError> {
        use super::page_table::try_filled;
        let ways = ways.max(1) as usize;
        let sets = (blocks / ways as u64).max(1);
        let n = sets * ways as u64;
        Ok(BlockCache {
            sets,
            ways,
            slots: try_filled(n, Way::default(), "the cache's ways")?,
            tags: try_filled(n, 0, "the cache's tags")?,
            tick: 0,
        })
    }

    /// Bytes of bookkeeping per block of capacity.
    pub const BYTES_PER_BLOCK: u64 = (std::mem::size_of::<Way>() + 8) as u64;

    pub fn ways(&self) -> usize {
        self.ways
    }

    /// How many ways of `block`'s set hold a block.
    pub fn occupied(&self, block: u64) -> usize {
        let start = self.set_start(block);
        self.tags[start..start + self.ways]
            .iter()
            .filter(|&&t| t != 0)
            .count()
    }

    /// Empty the way holding `block`, if one does.
    pub fn remove(&mut self, block: u64) -> bool {
        match self.find(block) {
            Some(i) => {
                self.tags[i] = 0;
                self.slots[i] = Way::default();
                true
            }
            None => false,
        }
    }

    /// The ways in use, in index order.
    pub fn resident(&self) -> impl Iterator<Item = &Way> {
        self.slots.iter().filter(|w| w.tag != 0)
    }

    pub fn blocks(&self) -> u64 {
        self.sets * self.ways as u64
    }

    #[inline]
    fn set_start(&self, block: u64) -> usize {
        let set = if self.sets.is_power_of_two() {
            block & (self.sets - 1)
        } else {
            block % self.sets
        };
        set as usize * self.ways
    }

    /// The way holding `block`, marked most recently used.
    #[inline]
    pub fn lookup(&mut self, block: u64) -> Option<WayIndex> {
        let found = self.find(block)?;
        self.tick += 1;
        self.slots[found].last_use = self.tick;
        Some(found)
    }

    /// The way holding `block`, without touching LRU state.
    #[inline]
    pub fn find(&self, block: u64) -> Option<WayIndex> {
        let start = self.set_start(block);
        // A block is in at most one way: compare them all without an early
        // exit (conditional moves, no mispredicted loop exit per access).
        let tag = block + 1;
        let mut found = usize::MAX;
        for (i, &t) in self.tags[start..start + self.ways].iter().enumerate() {
            found = if t == tag { i } else { found };
        }
        // Wrapping: `then_some` computes its value even when nothing was found.
        (found != usize::MAX).then_some(start.wrapping_add(found))
    }

    /// Whether `block` is present, without touching LRU state.
    pub fn contains(&self, block: u64) -> bool {
        self.find(block).is_some()
    }

    /// The way `block` would replace: an empty one, else the least recently
    /// used. Returns its index and what it holds now.
    #[inline]
    pub fn victim(&self, block: u64) -> (WayIndex, Way) {
        let start = self.set_start(block);
        let set = &self.slots[start..start + self.ways];
        let i = set
            .iter()
            .enumerate()
            .min_by_key(|(_, w)| if w.tag == 0 { 0 } else { w.last_use + 1 })
            .map(|(i, _)| i)
            .expect("a set has ways");
        (start + i, set[i])
    }

    /// The least recently used way other than `except` in `block`'s set
    /// (the next victim: early write-back's candidate).
    pub fn next_victim(&self, block: u64, except: WayIndex) -> Option<WayIndex> {
        let start = self.set_start(block);
        (start..start + self.ways)
            .filter(|&i| i != except && self.slots[i].tag != 0)
            .min_by_key(|&i| self.slots[i].last_use)
    }

    /// Put `block` in way `index` as most recently used.
    #[inline]
    pub fn install(&mut self, index: WayIndex, block: u64, ready_ns: Ns, dirty: bool) {
        debug_assert_eq!(self.set_start(block), index - index % self.ways);
        self.tick += 1;
        self.tags[index] = block + 1;
        self.slots[index] = Way {
            tag: block + 1,
            last_use: self.tick,
            ready_ns,
            dirty,
            prefetched: false,
        };
    }

    #[inline]
    pub fn way(&self, index: WayIndex) -> &Way {
        &self.slots[index]
    }

    #[inline]
    pub fn way_mut(&mut self, index: WayIndex) -> &mut Way {
        &mut self.slots[index]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_replaces_the_least_recently_used() {
        let mut c = BlockCache::new(4, 2); // 2 sets × 2 ways
        for b in [0, 2] {
            let (i, old) = c.victim(b);
            assert_eq!(old.block(), None);
            c.install(i, b, 0, false);
        }
        assert!(c.lookup(0).is_some()); // 0 is now MRU
        let (i, old) = c.victim(4);
        assert_eq!(old.block(), Some(2));
        c.install(i, 4, 0, true);
        assert!(c.contains(0) && c.contains(4) && !c.contains(2));
        let at4 = c.lookup(4).unwrap();
        assert!(c.way(at4).dirty);
        let next = c.next_victim(4, at4).unwrap();
        assert_eq!(c.way(next).block(), Some(0));
    }
}
