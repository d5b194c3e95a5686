//! Journaling and the page table (SPEC §7 "Journaling", "Page table entry",
//! "Sub-page valid bits", "Garbage collection", "Wear").
//!
//! Flash is never written in place. A 64 KB virtual page is a run of
//! segments (8 KB with 8 KB flash pages: eight; in general 64 KB / flash
//! page); a write-back writes only the dirty segments, into free pages of
//! one block at a starting page N: segment s goes to N + s, or, if that
//! page is worn out or taken, to N + s + d, + 2d, + 3d … (d = segments per
//! page; with 8 KB pages the report's +8, +16, +24). The 32-bit sub-page
//! vector records which of those positions hold data.
//!
//! The page table is the one libnvmm uses too (`page_table.rs`, entries
//! of `entry.rs`: the report's 16-byte layout — 34-bit mapping, 30-bit
//! previous index, 32-bit vector, 24-bit time written, 8-bit status and
//! permissions): a direct table indexed by virtual page number, plus an
//! upper, non-indexable part holding older versions (`versions_per_page`
//! per virtual page; 3 in the report). An update copies the head to a free
//! upper entry E, links `prev = E`, and writes the new mapping, vector and
//! time into the head, exactly the report's pseudo-code. A segment's current data is in the newest entry
//! of the chain whose vector has it; older entries are the journal.
//!
//! Garbage collection runs on a plane whose free blocks fall below
//! `gc_free_blocks`: it takes the block with the fewest live pages,
//! consolidates the chain of every page that has data there, longest
//! chains first (the report's policy: consolidating a chain frees the most
//! space and shortens the lists a fill walks), which leaves the block with
//! no live page, and erases it. When the upper table is full, the longest
//! chain in the system is consolidated. Consolidation reads the current
//! segments and writes them as one new version; the chain's older versions
//! are discarded, oldest data first.
//!
//! Wear: every page has an endurance (program/erase cycles) drawn from a
//! normal distribution (`endurance_cycles`, `endurance_spread`); an erase
//! beyond it marks the page bad, and a bad page is skipped through the
//! sub-page vector. A block whose pages are all bad is retired.
//!
//! Left out: the mapping table's own flash copy, sync/rollback tokens,
//! permissions beyond a status byte, in-order programming of pages within
//! a block (the model lets a remapped segment go to a higher page first).

use super::config::NvmmConfig;
use super::entry::{status, Pte, FLASH_PAGE_BITS, PREV_BITS};
use super::flash::{FlashGeometry, FlashTiming};
use super::page_table::{longest_first, PageTable};
use crate::kernel::Rng;
use crate::units::Ns;
use std::collections::VecDeque;
use std::fmt;

/// Virtual page size (SPEC §7).
pub const VIRTUAL_PAGE_BYTES: u64 = 64 * 1024;

/// What the simulator writes into a head: a version with flash pages, read
/// and write allowed (the shared status bits, `entry::status`).
const WRITTEN: u8 = status::PRESENT | status::MAPPED | status::READ | status::WRITE;

const FREE: u8 = 0;
const LIVE: u8 = 1;
const STALE: u8 = 2;
const BAD: u8 = 3;
const NO_OWNER: u32 = u32::MAX;

/// The journal has no room left (flash worn out or full of live data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfSpace {
    pub message: String,
}

impl fmt::Display for OutOfSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "flash out of space: {}", self.message)
    }
}

#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct JournalStats {
    /// Write-backs and the segments they wrote.
    pub write_backs: u64,
    pub segments_written: u64,
    /// Flash pages programmed, including garbage collection's.
    pub pages_programmed: u64,
    pub gc_runs: u64,
    pub consolidations: u64,
    pub gc_pages_read: u64,
    pub erases: u64,
    pub bad_pages: u64,
    pub retired_blocks: u64,
    /// Segments whose first position was bad or taken, placed at +d, +2d, +3d.
    pub remapped_segments: u64,
}

pub struct Journal {
    geometry: FlashGeometry,
    pages_per_block: u64,
    segments_per_page: u32,
    positions: u32,
    virtual_pages: u32,
    table: PageTable,
    chain_len: Vec<u16>,
    page_state: Vec<u8>,
    page_owner: Vec<u32>,
    page_endurance: Vec<u32>,
    block_erases: Vec<u32>,
    block_live: Vec<u32>,
    block_next: Vec<u32>,
    free_blocks: Vec<VecDeque<u32>>,
    active: Vec<Option<u32>>,
    next_plane: u32,
    gc_free_blocks: u32,
    write_clock: u32,
    in_gc: bool,
    /// The caller's current time: flash bookings are made at it.
    now_ns: Ns,
    stats: JournalStats,
    /// Changes so far, for the debug builds' checks ([`Self::debug_check`]).
    changes: u64,
}

/// Up to this many pages and virtual pages, debug builds check the whole
/// journal after every change; a larger one (a wear run writes millions of
/// times) after changes 1, 2, 4, 8, … so the check stays O(n log n).
const CHECK_EVERY_CHANGE_UP_TO: usize = 1 << 14;

impl Journal {
    /// A journal over the configured flash for `virtual_pages` 64 KB pages
    /// (at most 80% of the flash, leaving room for versions and collection).
    pub fn new(config: &NvmmConfig, virtual_pages: u64, seed: u64) -> Result<Journal, OutOfSpace> {
        let geometry = FlashGeometry::new(config);
        let segments_per_page = (VIRTUAL_PAGE_BYTES / geometry.page_bytes) as u32;
        let pages = geometry.pages();
        let upper = virtual_pages * u64::from(config.journal.versions_per_page);
        if virtual_pages * u64::from(segments_per_page) * 5 > pages * 4 {
            return Err(OutOfSpace {
                message: format!(
                    "{virtual_pages} virtual pages of 64 KB need more than 80% of the {} MB of flash",
                    (pages * geometry.page_bytes) >> 20
                ),
            });
        }
        if virtual_pages + upper >= 1 << PREV_BITS || pages >= 1 << FLASH_PAGE_BITS {
            return Err(OutOfSpace {
                message: "the page table exceeds its 30-bit index or 34-bit mapping".into(),
            });
        }
        let table = PageTable::new(
            virtual_pages,
            config.journal.versions_per_page.into(),
            segments_per_page,
            false,
        )
        .map_err(|e| OutOfSpace {
            message: e.to_string(),
        })?;
        let mut rng = Rng::stream(seed, 0x0E0D);
        let mean = config.flash.endurance_cycles as f64;
        let sd = mean * config.flash.endurance_spread;
        let page_endurance = (0..pages)
            .map(|_| {
                // Box–Muller: one normal deviate per page.
                let u1 = rng.unit().max(f64::MIN_POSITIVE);
                let u2 = rng.unit();
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (mean + sd * z).round().clamp(1.0, u32::MAX as f64) as u32
            })
            .collect();
        let planes = geometry.planes();
        let free_blocks = (0..planes)
            .map(|p| (p * geometry.blocks_per_plane..(p + 1) * geometry.blocks_per_plane).collect())
            .collect();
        let blocks = geometry.blocks() as usize;
        Ok(Journal {
            geometry,
            pages_per_block: geometry.pages_per_block.into(),
            segments_per_page,
            positions: 32 / segments_per_page,
            virtual_pages: virtual_pages as u32,
            table,
            chain_len: vec![0; virtual_pages as usize],
            page_state: vec![FREE; pages as usize],
            page_owner: vec![NO_OWNER; pages as usize],
            page_endurance,
            block_erases: vec![0; blocks],
            block_live: vec![0; blocks],
            block_next: vec![0; blocks],
            free_blocks,
            active: vec![None; planes as usize],
            next_plane: 0,
            gc_free_blocks: config.journal.gc_free_blocks,
            write_clock: 0,
            in_gc: false,
            now_ns: 0,
            stats: JournalStats::default(),
            changes: 0,
        })
    }

    pub fn segments_per_page(&self) -> u32 {
        self.segments_per_page
    }

    pub fn virtual_pages(&self) -> u64 {
        self.virtual_pages.into()
    }

    pub fn stats(&self) -> JournalStats {
        self.stats
    }

    pub fn entry(&self, index: u32) -> Pte {
        self.table.pte(index)
    }

    pub fn chain_length(&self, vpn: u64) -> u32 {
        self.chain_len[vpn as usize].into()
    }

    /// Fraction of flash pages retired as bad.
    pub fn retired_fraction(&self) -> f64 {
        self.stats.bad_pages as f64 / self.geometry.pages() as f64
    }

    /// Where segment `segment` of `vpn` currently is, and how many chain
    /// entries the controller read to find it; `None` if never written.
    #[inline]
    pub fn locate(&self, vpn: u64, segment: u32) -> Option<(u64, u32)> {
        self.table.locate(vpn, segment, None)
    }

    /// Write every segment of `virtual_pages` pages once, without timing
    /// (data that existed before the measured run).
    pub fn preload(&mut self) -> Result<(), OutOfSpace> {
        let all = (1u32 << self.segments_per_page) - 1;
        let mut written = Ok(());
        for vpn in 0..u64::from(self.virtual_pages) {
            if let Err(e) = self.write_version(self.now_ns, vpn, all, None) {
                written = Err(e);
                break;
            }
        }
        self.debug_check();
        written
    }

    /// Write the segments of `vpn` in `dirty_mask` (bit s = segment s) as a
    /// new version, asked at `now_ns` with the data ready at `start_ns`;
    /// returns when they are durable (`start_ns` without a flash timing).
    pub fn write_back(
        &mut self,
        now_ns: Ns,
        start_ns: Ns,
        vpn: u64,
        dirty_mask: u32,
        flash: Option<&mut FlashTiming>,
    ) -> Result<Ns, OutOfSpace> {
        self.now_ns = self.now_ns.max(now_ns);
        let durable = self.write_version(start_ns.max(self.now_ns), vpn, dirty_mask, flash);
        self.debug_check();
        durable
    }

    /// Delete virtual page `vpn` from the flash (the report's `delete`:
    /// "Immediately deletes the given flash page from the system"): every
    /// version of it becomes stale, for collection to erase. A later write
    /// creates it again.
    pub fn delete(&mut self, vpn: u64) {
        if vpn < u64::from(self.virtual_pages) && self.chain_len[vpn as usize] > 0 {
            self.drop_chain(vpn);
            self.debug_check();
        }
    }

    /// Debug builds check the bookkeeping ([`Self::check_invariants`])
    /// after every change of a small journal, and after changes 1, 2, 4, …
    /// of a large one ([`CHECK_EVERY_CHANGE_UP_TO`]); release builds do
    /// nothing.
    #[inline]
    fn debug_check(&mut self) {
        if !cfg!(debug_assertions) {
            return;
        }
        self.changes += 1;
        let small = self.page_state.len() + self.virtual_pages as usize <= CHECK_EVERY_CHANGE_UP_TO;
        if small || self.changes.is_power_of_two() {
            if let Err(e) = self.check_invariants() {
                panic!(
                    "journal invariant broken after change {}: {e}",
                    self.changes
                );
            }
        }
    }

    fn write_version(
        &mut self,
        start_ns: Ns,
        vpn: u64,
        dirty_mask: u32,
        mut flash: Option<&mut FlashTiming>,
    ) -> Result<Ns, OutOfSpace> {
        if dirty_mask == 0 {
            return Ok(start_ns);
        }
        let mut now = start_ns;
        if self.table.pte(vpn as u32).mapped() && !self.table.has_free_version() {
            now = self.reclaim_entries(now, flash.as_deref_mut())?;
        }
        let (mapping, vector, pages, count) = self.place(dirty_mask, now, flash.as_deref_mut())?;
        let prev = self
            .table
            .push_version(vpn, 0)
            .map_err(|_| OutOfSpace {
                message: "no free page-table entry for a previous version".into(),
            })?
            .prev;
        self.write_clock = self.write_clock.wrapping_add(1);
        self.table.set_pte(
            vpn as u32,
            Pte::new(mapping, prev, vector, self.write_clock, WRITTEN),
        );
        self.chain_len[vpn as usize] = self.chain_len[vpn as usize].saturating_add(1);
        let mut done = now;
        for &page in &pages[..count] {
            self.page_state[page as usize] = LIVE;
            self.page_owner[page as usize] = vpn as u32;
            self.block_live[(page / self.pages_per_block) as usize] += 1;
            if let Some(f) = flash.as_deref_mut() {
                done =
                    done.max(f.program_page_at(self.now_ns, now, page, self.geometry.page_bytes));
            }
        }
        self.stats.write_backs += 1;
        self.stats.segments_written += count as u64;
        self.stats.pages_programmed += count as u64;
        Ok(done)
    }

    /// Consolidate the longest chains until a sixteenth of the upper table
    /// is free (in one pass, so the search is paid once per many updates).
    fn reclaim_entries(
        &mut self,
        now: Ns,
        mut flash: Option<&mut FlashTiming>,
    ) -> Result<Ns, OutOfSpace> {
        let upper = self.table.version_capacity() as usize;
        let target = (upper / 16).max(1);
        let mut done = now;
        for vpn in longest_first(&self.chain_len) {
            if self.table.version_capacity() - self.table.versions_used() >= target as u64 {
                break;
            }
            done = done.max(self.consolidate(now, vpn.into(), false, flash.as_deref_mut())?);
        }
        Ok(done)
    }

    /// Read the current segments of `vpn` and write them as one version,
    /// discarding the older ones. Without `force`, a chain of one is left.
    fn consolidate(
        &mut self,
        now: Ns,
        vpn: u64,
        force: bool,
        mut flash: Option<&mut FlashTiming>,
    ) -> Result<Ns, OutOfSpace> {
        let len = self.chain_len[vpn as usize];
        if len == 0 || (len == 1 && !force) {
            return Ok(now);
        }
        let mut mask = 0;
        let mut read_done = now;
        for s in 0..self.segments_per_page {
            if let Some((page, _)) = self.locate(vpn, s) {
                mask |= 1 << s;
                self.stats.gc_pages_read += 1;
                if let Some(f) = flash.as_deref_mut() {
                    let r = f.read_page_at(self.now_ns, now, page, self.geometry.page_bytes);
                    read_done = read_done.max(r.done_ns);
                }
            }
        }
        self.drop_chain(vpn);
        self.stats.consolidations += 1;
        self.write_version(read_done, vpn, mask, flash)
    }

    /// Forget every version of `vpn`: its pages become stale, its upper
    /// entries free.
    fn drop_chain(&mut self, vpn: u64) {
        let mut e = vpn as u32;
        loop {
            let pte = self.table.pte(e);
            if pte.mapped() {
                for bit in 0..32u32 {
                    if pte.vector() >> bit & 1 == 1 {
                        let page = pte.mapping() + u64::from(bit);
                        self.page_state[page as usize] = STALE;
                        self.page_owner[page as usize] = NO_OWNER;
                        self.block_live[(page / self.pages_per_block) as usize] -= 1;
                    }
                }
            }
            if e != vpn as u32 {
                self.table.free_version(e);
            }
            e = pte.prev();
            if e == 0 {
                break;
            }
        }
        self.table.set_pte(vpn as u32, Pte::default());
        self.chain_len[vpn as usize] = 0;
    }

    /// Choose flash pages for the dirty segments: (mapping, vector, pages).
    fn place(
        &mut self,
        mask: u32,
        now: Ns,
        mut flash: Option<&mut FlashTiming>,
    ) -> Result<(u64, u32, [u64; 32], usize), OutOfSpace> {
        let planes = self.geometry.planes();
        let attempts = self.geometry.blocks() + 2 * planes;
        let mut tried_planes = 0;
        for _ in 0..attempts {
            let plane = self.next_plane;
            let Some(block) = self.active_block(plane, now, flash.as_deref_mut())? else {
                self.next_plane = (plane + 1) % planes;
                tried_planes += 1;
                if tried_planes > planes {
                    break;
                }
                continue;
            };
            if let Some(placed) = self.fit(block, mask) {
                self.next_plane = (plane + 1) % planes;
                return Ok(placed);
            }
            self.active[plane as usize] = None; // full: close it
        }
        Err(OutOfSpace {
            message: format!(
                "no block can take a write ({} bad pages, {} retired blocks)",
                self.stats.bad_pages, self.stats.retired_blocks
            ),
        })
    }

    fn active_block(
        &mut self,
        plane: u32,
        now: Ns,
        flash: Option<&mut FlashTiming>,
    ) -> Result<Option<u32>, OutOfSpace> {
        if let Some(b) = self.active[plane as usize] {
            return Ok(Some(b));
        }
        if !self.in_gc && (self.free_blocks[plane as usize].len() as u32) < self.gc_free_blocks {
            self.collect(plane, now, flash)?;
        }
        let b = self.free_blocks[plane as usize].pop_front();
        self.active[plane as usize] = b;
        Ok(b)
    }

    /// Find a starting page N in `block` where every dirty segment has a
    /// free, good page at N + s + k·d; take the pages.
    fn fit(&mut self, block: u32, mask: u32) -> Option<(u64, u32, [u64; 32], usize)> {
        let ppb = self.pages_per_block as u32;
        let base = u64::from(block) * self.pages_per_block;
        let d = self.segments_per_page;
        let s_min = mask.trailing_zeros();
        let s_max = 31 - mask.leading_zeros();
        let start = self.block_next[block as usize].saturating_sub(s_min);
        for n in start..ppb.saturating_sub(s_min) {
            let mut vector = 0u32;
            let mut pages = [0u64; 32];
            let mut count = 0;
            let mut remapped = 0;
            let mut ok = true;
            for s in (0..d).filter(|s| mask >> s & 1 == 1) {
                let found = (0..self.positions).find(|k| {
                    let p = n + s + k * d;
                    p < ppb && self.page_state[(base + u64::from(p)) as usize] == FREE
                });
                match found {
                    Some(k) => {
                        vector |= 1 << (k * d + s);
                        pages[count] = base + u64::from(n + s + k * d);
                        count += 1;
                        remapped += u64::from(k > 0);
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            if ok {
                self.block_next[block as usize] = n + s_max + 1;
                self.stats.remapped_segments += remapped;
                return Some((base + u64::from(n), vector, pages, count));
            }
        }
        None
    }

    /// Garbage-collect `plane` until it has `gc_free_blocks` free blocks.
    fn collect(
        &mut self,
        plane: u32,
        now: Ns,
        mut flash: Option<&mut FlashTiming>,
    ) -> Result<(), OutOfSpace> {
        self.in_gc = true;
        self.stats.gc_runs += 1;
        let first = plane * self.geometry.blocks_per_plane;
        let result = (|| {
            for _ in 0..self.geometry.blocks_per_plane {
                if self.free_blocks[plane as usize].len() as u32 >= self.gc_free_blocks {
                    break;
                }
                let victim = (first..first + self.geometry.blocks_per_plane)
                    .filter(|&b| {
                        self.active[plane as usize] != Some(b)
                            && self.block_next[b as usize] > 0
                            && !self.free_blocks[plane as usize].contains(&b)
                    })
                    .min_by_key(|&b| self.block_live[b as usize]);
                let Some(victim) = victim else { break };
                let base = u64::from(victim) * self.pages_per_block;
                let mut owners: Vec<u32> = (base..base + self.pages_per_block)
                    .filter(|&p| self.page_state[p as usize] == LIVE)
                    .map(|p| self.page_owner[p as usize])
                    .collect();
                owners.sort_unstable();
                owners.dedup();
                // Longest chains first.
                owners.sort_by_key(|&v| std::cmp::Reverse(self.chain_len[v as usize]));
                for vpn in owners {
                    self.consolidate(now, vpn.into(), true, flash.as_deref_mut())?;
                }
                debug_assert_eq!(self.block_live[victim as usize], 0);
                self.erase(victim, now, flash.as_deref_mut());
            }
            Ok(())
        })();
        self.in_gc = false;
        result
    }

    fn erase(&mut self, block: u32, now: Ns, flash: Option<&mut FlashTiming>) {
        let b = block as usize;
        self.block_erases[b] += 1;
        let base = u64::from(block) * self.pages_per_block;
        let mut good = 0;
        for p in base..base + self.pages_per_block {
            let p = p as usize;
            if self.page_state[p] == BAD {
                continue;
            }
            if self.page_endurance[p] <= self.block_erases[b] {
                self.page_state[p] = BAD;
                self.stats.bad_pages += 1;
            } else {
                self.page_state[p] = FREE;
                good += 1;
            }
        }
        self.block_next[b] = 0;
        self.block_live[b] = 0;
        self.stats.erases += 1;
        if let Some(f) = flash {
            f.erase_block_at(self.now_ns, now, base);
        }
        let plane = block / self.geometry.blocks_per_plane;
        if good == 0 {
            self.stats.retired_blocks += 1;
        } else {
            self.free_blocks[plane as usize].push_back(block);
        }
    }

    /// Check the bookkeeping: live counts match page states, every live page
    /// is referenced by exactly one entry of its owner's chain.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut live = vec![0u32; self.block_live.len()];
        let mut referenced = vec![false; self.page_state.len()];
        for vpn in 0..self.virtual_pages {
            let mut e = vpn;
            let mut n = 0;
            loop {
                let pte = self.table.pte(e);
                if pte.mapped() {
                    n += 1;
                    for bit in 0..32u32 {
                        if pte.vector() >> bit & 1 == 1 {
                            let p = (pte.mapping() + u64::from(bit)) as usize;
                            if referenced[p] || self.page_state[p] != LIVE {
                                return Err(format!(
                                    "page {p} of vpn {vpn} referenced twice or not live"
                                ));
                            }
                            referenced[p] = true;
                            live[p / self.pages_per_block as usize] += 1;
                        }
                    }
                }
                e = pte.prev();
                if e == 0 {
                    break;
                }
            }
            if n != u32::from(self.chain_len[vpn as usize]) {
                return Err(format!(
                    "vpn {vpn}: chain of {n}, recorded {}",
                    self.chain_len[vpn as usize]
                ));
            }
        }
        if live != self.block_live {
            return Err("block live counts disagree with the table".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> NvmmConfig {
        let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
        c.flash.channels = 2;
        c.flash.volumes_per_channel = 1;
        c.flash.blocks_per_plane = 16;
        c.flash.pages_per_block = 64;
        c
    }

    #[test]
    fn updates_chain_versions_and_only_dirty_segments_are_written() {
        let c = small();
        let mut j = Journal::new(&c, 8, 1).unwrap();
        j.write_back(0, 0, 3, 0xFF, None).unwrap();
        let first = j.locate(3, 5).unwrap().0;
        j.write_back(0, 0, 3, 0b0010_0100, None).unwrap(); // segments 2 and 5
        assert_eq!(j.chain_length(3), 2);
        assert_eq!(j.stats().segments_written, 10);
        let (now5, hops) = j.locate(3, 5).unwrap();
        assert_ne!(now5, first);
        assert_eq!(hops, 1);
        // Segment 0 is found in the previous version, one hop down.
        assert_eq!(j.locate(3, 0).unwrap().1, 2);
        let head = j.entry(3);
        assert_eq!(head.vector().count_ones(), 2);
        assert_ne!(head.prev(), 0);
        assert_eq!(j.entry(head.prev()).vector(), 0xFF);
        assert!(j.locate(4, 0).is_none());
        j.check_invariants().unwrap();
    }

    #[test]
    fn bad_pages_are_skipped_through_the_vector() {
        let c = small();
        let mut j = Journal::new(&c, 8, 1).unwrap();
        // Mark pages 3 and 6 of the first block bad, as the report's example.
        let block = j.free_blocks[0][0];
        let base = u64::from(block) * j.pages_per_block;
        j.page_state[(base + 3) as usize] = BAD;
        j.page_state[(base + 6) as usize] = BAD;
        j.write_back(0, 0, 0, 0xFF, None).unwrap();
        let v = j.entry(0).vector();
        assert_eq!(v, 0b1011_0111 | 1 << (8 + 3) | 1 << (8 + 6), "{v:032b}");
        assert_eq!(j.locate(0, 3).unwrap().0, base + 11);
        assert_eq!(j.stats().remapped_segments, 2);
    }

    #[test]
    fn garbage_collection_keeps_data_and_wears_blocks() {
        let seed = 20261123;
        println!("seed {seed}");
        let mut c = small();
        c.flash.endurance_cycles = 40;
        let mut j = Journal::new(&c, 16, seed).unwrap();
        j.preload().unwrap();
        let mut rng = Rng::new(seed);
        let mut out_of_space = false;
        for i in 0..200_000u64 {
            let vpn = rng.below(16);
            let mask = 1 << rng.below(8);
            match j.write_back(i, i, vpn, mask as u32, None) {
                Ok(_) => {}
                Err(_) => {
                    out_of_space = true;
                    break;
                }
            }
            if i % 5000 == 0 {
                j.check_invariants().unwrap();
                for v in 0..16 {
                    for s in 0..8 {
                        assert!(j.locate(v, s).is_some(), "vpn {v} seg {s} lost");
                    }
                }
            }
        }
        let s = j.stats();
        assert!(s.gc_runs > 0 && s.erases > 0, "{s:?}");
        assert!(s.bad_pages > 0, "{s:?}");
        assert!(out_of_space, "40-cycle flash should wear out: {s:?}");
    }
}
