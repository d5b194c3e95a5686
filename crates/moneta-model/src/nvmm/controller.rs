//! The hybrid DRAM/flash controller (SPEC §7 "Organization", "Miss path").
//!
//! Every CPU access (64 B) reads the set's tags from DRAM (tags live in
//! DRAM), then on a hit the line. On a miss: choose the LRU victim; if it is
//! dirty, read it out of DRAM and write it back through the journal (a new
//! version of its virtual page holding that segment only: the cache evicts
//! blocks, and writing the page's other dirty segments early would
//! multiply the writes in flight); translate the
//! address (the page table's chain, through a small TLB-like mapping cache;
//! a miss there reads each chain entry from the mapping DRAM); read the
//! flash page; return the requested 64 B once the whole page has crossed
//! the channel (HybridSim's miss path, `controller.critical_word_first =
//! false`), or as soon as they cross it (`true`); fill the DRAM block. Optional: prefetch the next
//! `prefetch_pages` flash pages, and early write-back of the set's next
//! victim when it is dirty.
//!
//! Timing is by reservation: each component (`dram.rs`, `flash.rs`) is
//! called at the instant an operation reaches it and answers when it
//! completes, so concurrent misses of several threads queue on banks,
//! channels, dies and planes. A block is installed when its miss is
//! handled, with the time its fill completes; a later access waits for it.
//!
//! The miss's decisions (victim, write-back, fill, early write-back) are
//! `miss_path.rs`'s, shared with libnvmm; this controller is the
//! simulator's face of it (`MissFace`): reservations in virtual time.

use super::cache::BlockCache;
use super::config::{NvmmConfig, StartBlocks};
use super::dram::DramTiming;
use super::flash::{FlashStats, FlashTiming};
use super::journal::{Journal, JournalStats, OutOfSpace, VIRTUAL_PAGE_BYTES};
use super::miss_path::{self, Fetched, MissFace};
use super::workload::{Access, AccessKind};
use crate::units::Ns;

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ControllerStats {
    pub accesses: u64,
    pub hits: u64,
    /// Hits on a block whose fill was still in flight.
    pub hits_in_flight: u64,
    pub misses: u64,
    pub prefetches: u64,
    /// Prefetched blocks touched before eviction.
    pub prefetches_used: u64,
    pub write_backs: u64,
    pub early_write_backs: u64,
    pub mapping_misses: u64,
    /// Misses to never-written pages (created, no flash read).
    pub creations: u64,
}

pub struct HybridController {
    page_bytes: u64,
    line_bytes: u64,
    segments_per_page: u64,
    controller_ns: Ns,
    prefetch_pages: u64,
    early_writeback: bool,
    critical_word_first: bool,
    start_dirty: bool,
    start_blocks: StartBlocks,
    mapping_tags: Vec<u64>,
    mapping_read_ns: Ns,
    footprint_blocks: u64,
    cache: BlockCache,
    dram: DramTiming,
    flash: FlashTiming,
    journal: Journal,
    /// The current access's time: every booking is made at it.
    now_ns: Ns,
    stats: ControllerStats,
}

impl HybridController {
    /// A controller whose flash holds `footprint_bytes` of data written
    /// before the run (preloaded into the journal).
    pub fn new(config: &NvmmConfig, footprint_bytes: u64, seed: u64) -> Result<Self, OutOfSpace> {
        let page_bytes = config.flash.page_bytes;
        let virtual_pages = footprint_bytes.div_ceil(VIRTUAL_PAGE_BYTES).max(1);
        let mut journal = Journal::new(config, virtual_pages, seed)?;
        journal.preload()?;
        let dram = DramTiming::new(config);
        Ok(HybridController {
            page_bytes,
            line_bytes: config.dram.line_bytes,
            segments_per_page: VIRTUAL_PAGE_BYTES / page_bytes,
            controller_ns: config.controller.controller_ns,
            prefetch_pages: config.controller.prefetch_pages.into(),
            early_writeback: config.controller.early_writeback,
            critical_word_first: config.controller.critical_word_first,
            start_dirty: config.controller.start_dirty,
            start_blocks: config.controller.start_blocks,
            mapping_tags: vec![0; config.controller.mapping_cache_entries.max(1) as usize],
            mapping_read_ns: dram.idle_read_ns(16),
            footprint_blocks: virtual_pages * (VIRTUAL_PAGE_BYTES / page_bytes),
            cache: BlockCache::new(config.cache_blocks(), config.controller.ways),
            dram,
            flash: FlashTiming::new(config),
            journal,
            now_ns: 0,
            stats: ControllerStats::default(),
        })
    }

    /// Fill the DRAM cache before the run: the footprint's last blocks
    /// (just written), dirty or clean as `controller.start_dirty` says, or
    /// with `controller.start_blocks = "other"` as many clean blocks of
    /// addresses above the footprint (data the workload never touches).
    pub fn warm(&mut self) {
        let (first, n, dirty) = match self.start_blocks {
            StartBlocks::Footprint => {
                let n = self.cache.blocks().min(self.footprint_blocks);
                (self.footprint_blocks - n, n, self.start_dirty)
            }
            StartBlocks::Other => (self.footprint_blocks, self.cache.blocks(), false),
        };
        for block in first..first + n {
            let (w, old) = self.cache.victim(block);
            if old.block().is_none() {
                self.cache.install(w, block, 0, dirty);
            }
        }
    }

    pub fn stats(&self) -> ControllerStats {
        self.stats
    }
    pub fn flash_stats(&self) -> FlashStats {
        self.flash.stats()
    }
    pub fn journal_stats(&self) -> JournalStats {
        self.journal.stats()
    }
    /// The blocks the DRAM cache holds, in order (for comparing the
    /// controller's decisions with libnvmm's, `libnvmm/tests/twin.rs`).
    pub fn resident_blocks(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.cache.resident().filter_map(|w| w.block()).collect();
        v.sort_unstable();
        v
    }
    /// The journal's versions of virtual page `vpn` (its chain's length).
    pub fn chain_length(&self, vpn: u64) -> u32 {
        self.journal.chain_length(vpn)
    }

    /// One CPU access at `now_ns`; returns when the thread may go on (the
    /// line's data for a read, the write accepted for a posted write).
    #[inline]
    pub fn access(&mut self, now_ns: Ns, a: Access) -> Result<Ns, OutOfSpace> {
        self.stats.accesses += 1;
        self.now_ns = now_ns;
        let block = a.addr >> self.page_bytes.trailing_zeros(); // a power of two (validated)
        let t = now_ns + self.controller_ns;
        let tags_read = self.dram.access(now_ns, t, block, self.line_bytes, false);
        if let Some(w) = self.cache.lookup(block) {
            self.stats.hits += 1;
            let way = self.cache.way_mut(w);
            if way.prefetched {
                way.prefetched = false;
                self.stats.prefetches_used += 1;
            }
            if way.ready_ns > tags_read {
                self.stats.hits_in_flight += 1;
            }
            let start = tags_read.max(way.ready_ns);
            if a.kind != AccessKind::Read {
                way.dirty = true;
            }
            return Ok(match a.kind {
                AccessKind::Write => {
                    self.dram
                        .access(now_ns, start, block, self.line_bytes, true);
                    tags_read
                }
                AccessKind::Read => self
                    .dram
                    .access(now_ns, start, block, self.line_bytes, false),
                AccessKind::Update => {
                    let done = self
                        .dram
                        .access(now_ns, start, block, self.line_bytes, false);
                    self.dram.access(now_ns, done, block, self.line_bytes, true);
                    done
                }
            });
        }
        self.stats.misses += 1;
        let critical = self.handle_miss(tags_read, block, a.kind != AccessKind::Read, false)?;
        let last = (block + self.prefetch_pages).min(self.footprint_blocks.saturating_sub(1));
        for next in block + 1..=last {
            if !self.cache.contains(next) {
                self.handle_miss(tags_read, next, false, true)?;
                self.stats.prefetches += 1;
            }
        }
        Ok(match a.kind {
            AccessKind::Write => tags_read,
            _ => critical + self.controller_ns,
        })
    }

    /// Handle the miss of `block` at `now` through the miss path both
    /// faces share ([`miss_path::miss`]); returns when the requested line
    /// has arrived.
    #[inline]
    fn handle_miss(
        &mut self,
        now: Ns,
        block: u64,
        dirty: bool,
        prefetch: bool,
    ) -> Result<Ns, OutOfSpace> {
        let m = miss_path::miss(self, now, block, dirty, self.early_writeback)?;
        if prefetch {
            self.cache.way_mut(m.way).prefetched = true;
        }
        self.stats.early_write_backs += u64::from(m.written_early);
        Ok(m.critical_ns)
    }
}

/// The simulator's face of the miss path: DRAM and flash reservations in
/// virtual time, the journal on physical flash as the storage, no bytes.
impl MissFace for HybridController {
    type Error = OutOfSpace;

    #[inline]
    fn cache(&mut self) -> &mut BlockCache {
        &mut self.cache
    }

    /// Read the block out of DRAM, then program it as a new version of its
    /// virtual page holding only this segment (the others stay in older
    /// versions). Returns when it has left the DRAM.
    fn write_back(&mut self, now: Ns, block: u64) -> Result<Ns, OutOfSpace> {
        let vpn = block / self.segments_per_page;
        let mask = 1u32 << (block % self.segments_per_page);
        let read_out = self
            .dram
            .access(self.now_ns, now, block, self.page_bytes, false);
        self.stats.write_backs += 1;
        self.journal
            .write_back(self.now_ns, read_out, vpn, mask, Some(&mut self.flash))?;
        Ok(read_out)
    }

    /// A DRAM way holds no bytes here: nothing to drop.
    #[inline]
    fn evict(&mut self, _block: u64) -> Result<(), OutOfSpace> {
        Ok(())
    }

    /// Translation through the page table's chain (a mapping-cache miss
    /// reads each entry walked from the mapping DRAM), then the flash read;
    /// a never-written block is created without one.
    #[inline]
    fn fetch(&mut self, now: Ns, block: u64) -> Result<Fetched, OutOfSpace> {
        let vpn = block / self.segments_per_page;
        let segment = (block % self.segments_per_page) as u32;
        let location = self.journal.locate(vpn, segment);
        let mut translated = now;
        if let Some((_, hops)) = location {
            let slot = (vpn % self.mapping_tags.len() as u64) as usize;
            if self.mapping_tags[slot] != vpn + 1 {
                self.mapping_tags[slot] = vpn + 1;
                self.stats.mapping_misses += 1;
                translated += u64::from(hops) * self.mapping_read_ns;
            }
        }
        Ok(match location {
            Some((page, _)) => {
                let r = self
                    .flash
                    .read_page_at(self.now_ns, translated, page, self.page_bytes);
                Fetched {
                    critical_ns: if self.critical_word_first {
                        r.critical_ns
                    } else {
                        r.done_ns
                    },
                    done_ns: r.done_ns,
                }
            }
            None => {
                self.stats.creations += 1;
                Fetched {
                    critical_ns: translated,
                    done_ns: translated,
                }
            }
        })
    }

    /// The block is written into DRAM once its data is in and the victim
    /// has been read out.
    #[inline]
    fn fill(&mut self, _now: Ns, data: Ns, victim_out: Ns, block: u64) -> Result<Ns, OutOfSpace> {
        Ok(self.dram.access(
            self.now_ns,
            data.max(victim_out),
            block,
            self.page_bytes,
            true,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> NvmmConfig {
        let mut c = NvmmConfig::preset("nvmm-slc").unwrap();
        c.dram.capacity_bytes = 16 * 8192; // 16 blocks: one set of 16 ways
        c
    }

    fn read(addr: u64) -> Access {
        Access {
            addr,
            kind: AccessKind::Read,
        }
    }

    #[test]
    fn a_miss_returns_the_line_when_it_crosses_the_channel_and_then_hits() {
        let mut c = small();
        // Whole page first (HybridSim): the line comes after the page.
        c.controller.critical_word_first = false;
        let mut n = HybridController::new(&c, 1 << 20, 1).unwrap();
        let t = n.access(0, read(8192 * 3 + 64)).unwrap();
        assert!(t >= FlashTiming::new(&c).idle_read_ns(8192), "{t}");
        c.controller.critical_word_first = true;
        let mut n = HybridController::new(&c, 1 << 20, 1).unwrap();
        let t = n.access(0, read(8192 * 3 + 64)).unwrap();
        let flash = FlashTiming::new(&c);
        // Tags (DRAM) + controller + the flash read up to the first 64 B.
        let floor = c.flash.read_ns + c.flash.command_ns + c.flash.ftl_ns;
        assert!(t > floor && t < floor + 2_000, "{t}");
        assert!(t < flash.idle_read_ns(8192), "critical word first");
        let hit = n.access(t + 30_000, read(8192 * 3)).unwrap() - (t + 30_000);
        assert!(hit < 200, "{hit}");
        let s = n.stats();
        assert_eq!((s.misses, s.hits), (1, 1));
    }

    #[test]
    fn prefetch_fills_the_next_pages_and_dirty_victims_are_written_back() {
        let mut c = small();
        c.controller.prefetch_pages = 4;
        let mut n = HybridController::new(&c, 1 << 20, 1).unwrap();
        n.access(0, read(0)).unwrap();
        assert_eq!(n.stats().prefetches, 4);
        assert_eq!(n.flash_stats().reads, 5);
        let t = n.access(1_000_000, read(8192 * 2)).unwrap();
        assert_eq!(n.stats().prefetches_used, 1);
        assert!(t - 1_000_000 < 200);
        // Dirty 16 blocks, then miss on 16 others: each evicts a dirty block.
        c.controller.prefetch_pages = 0;
        let mut n = HybridController::new(&c, 1 << 20, 1).unwrap();
        let mut now = 0;
        for b in 0..32u64 {
            let a = Access {
                addr: b * 8192,
                kind: AccessKind::Update,
            };
            now = n.access(now, a).unwrap() + 10;
        }
        assert_eq!(n.stats().write_backs, 16);
        assert_eq!(n.journal_stats().write_backs - 16, 16); // 16 preloaded pages
        assert_eq!(n.flash_stats().programs, 16);
    }
}
