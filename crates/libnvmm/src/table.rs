//! The NVMM page table (SPEC §7 "page table entry"): a direct table indexed
//! by virtual page number whose entries are the newest versions, and an
//! upper, non-indexable area holding older versions linked by the
//! previous-mapping index. The upper area has three entries per page, the
//! report's 1B-entry table for 16 TB. Index 0 is never a previous version
//! (it is page 0's head), so `prev == 0` ends a chain.
//!
//! Pure bookkeeping: which flash page holds a segment at a given time, and
//! which entries changed since the last commit. Flash blocks come from the
//! caller ([`crate::log::Log`]).

use crate::entry::{status, Entry, MAX_TABLE_ENTRIES, SEGMENTS_PER_PAGE};
use crate::error::{ErrorKind, NvmmError, Result};

/// Previous versions per page in the upper area (the report's 1B entries
/// for 256M pages of 64 KB).
pub const VERSIONS_PER_PAGE: u64 = 3;

pub struct Table {
    pages: u64,
    entries: Vec<Entry>,
    free_versions: Vec<u32>,
    changed: Vec<bool>,
    changed_list: Vec<u32>,
}

/// The largest region, in 64 KB pages: a 30-bit entry index reaches 2^30
/// entries, four per page (the head and three versions): 16 TiB.
pub const MAX_PAGES: u64 = MAX_TABLE_ENTRIES / (1 + VERSIONS_PER_PAGE);

/// Table entries (heads and versions) of a region of `pages` pages.
pub fn entries_for(pages: u64) -> u64 {
    pages.saturating_mul(1 + VERSIONS_PER_PAGE)
}

/// Bytes of memory the table of `pages` pages takes (entries, change
/// flags, free list).
pub fn memory_bytes(pages: u64) -> u64 {
    let per_entry = std::mem::size_of::<Entry>() + 1 + std::mem::size_of::<u32>();
    entries_for(pages).saturating_mul(per_entry as u64)
}

/// A vector of `n` copies of `value`, or an `Exhausted` error naming `what`
/// when the allocator refuses (never an abort).
pub(crate) fn try_filled<T: Clone>(n: u64, value: T, what: &str) -> Result<Vec<T>> {
    let refused = || {
        NvmmError::new(
            ErrorKind::Exhausted,
            format!("cannot allocate {n} entries for {what}"),
        )
    };
    let n = usize::try_from(n).map_err(|_| refused())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| refused())?;
    v.resize(n, value);
    Ok(v)
}

impl Table {
    pub fn new(pages: u64) -> Result<Table> {
        if pages == 0 || pages > MAX_PAGES {
            return Err(NvmmError::new(
                ErrorKind::InvalidArgument,
                format!("{pages} pages: a region has 1 ..= {MAX_PAGES} pages of 64 KB (16 TiB)"),
            ));
        }
        let total = entries_for(pages);
        let mut free_versions = Vec::new();
        free_versions
            .try_reserve_exact((total - pages) as usize)
            .map_err(|_| {
                NvmmError::new(
                    ErrorKind::Exhausted,
                    format!(
                        "cannot allocate the free list of {} versions",
                        total - pages
                    ),
                )
            })?;
        // Popped from the end: the lowest indexes are used first.
        free_versions.extend((pages as u32..total as u32).rev());
        Ok(Table {
            pages,
            entries: try_filled(total, Entry::default(), "the page table")?,
            free_versions,
            changed: try_filled(total, false, "the page table's change flags")?,
            changed_list: Vec::new(),
        })
    }

    /// Load `entries` (recovery) into a fresh table; rejects indexes out of
    /// range.
    pub fn load(&mut self, entries: impl IntoIterator<Item = (u32, Entry)>) -> Result<()> {
        for (index, e) in entries {
            let slot = self.entries.get_mut(index as usize).ok_or_else(|| {
                NvmmError::new(
                    ErrorKind::BadFile,
                    format!("table index {index} out of range"),
                )
            })?;
            *slot = e;
        }
        let pages = self.pages as u32;
        let entries = &self.entries;
        self.free_versions
            .retain(|&i| i >= pages && !entries[i as usize].is_present());
        Ok(())
    }

    /// A table holding `entries` (recovery); rejects indexes out of range.
    pub fn from_entries(
        pages: u64,
        entries: impl IntoIterator<Item = (u32, Entry)>,
    ) -> Result<Table> {
        let mut t = Table::new(pages)?;
        t.load(entries)?;
        Ok(t)
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }
    pub fn version_capacity(&self) -> u64 {
        self.pages * VERSIONS_PER_PAGE
    }
    pub fn versions_used(&self) -> u64 {
        self.version_capacity() - self.free_versions.len() as u64
    }

    pub fn get(&self, index: u32) -> Entry {
        self.entries[index as usize]
    }
    pub fn head(&self, vpn: u64) -> Entry {
        self.entries[vpn as usize]
    }

    pub fn set(&mut self, index: u32, e: Entry) {
        self.entries[index as usize] = e;
        if !self.changed[index as usize] {
            self.changed[index as usize] = true;
            self.changed_list.push(index);
        }
    }

    pub fn free_version(&mut self, index: u32) {
        debug_assert!(index as u64 >= self.pages);
        self.set(index, Entry::default());
        self.free_versions.push(index);
    }

    /// Indexes of `vpn`'s versions, newest first.
    pub fn chain(&self, vpn: u64) -> Vec<u32> {
        let mut out = Vec::new();
        let mut index = vpn as u32;
        loop {
            let e = self.entries[index as usize];
            if !e.is_present() {
                return out;
            }
            out.push(index);
            if e.prev == 0 {
                return out;
            }
            index = e.prev;
            assert!(
                out.len() as u64 <= self.version_capacity() + 1,
                "cycle in chain of page {vpn}"
            );
        }
    }

    pub fn chain_len(&self, vpn: u64) -> usize {
        let mut n = 0;
        let mut e = self.entries[vpn as usize];
        while e.is_present() {
            n += 1;
            if e.prev == 0 {
                break;
            }
            e = self.entries[e.prev as usize];
        }
        n
    }

    /// The flash page holding `segment` of `vpn` as of time `at` (None: now),
    /// or None when it reads as zero.
    pub fn locate(&self, vpn: u64, segment: usize, at: Option<u64>) -> Option<u64> {
        let mut e = self.entries[vpn as usize];
        while e.is_present() {
            let visible = at.is_none_or(|t| e.time as u64 <= t);
            if visible {
                if e.has(status::MAPPED) {
                    if let Some(fp) = e.segment_flash_page(segment) {
                        return Some(fp);
                    }
                }
                if e.has(status::FRESH) {
                    return None;
                }
            }
            if e.prev == 0 {
                return None;
            }
            e = self.entries[e.prev as usize];
        }
        None
    }

    /// Make room for a new head of `vpn`: the current head moves to a free
    /// entry of the upper area and the returned head (not yet stored) points
    /// to it. Fails with `Exhausted` when the upper area is full.
    pub fn push_version(&mut self, vpn: u64, time: u64) -> Result<Entry> {
        let head = self.head(vpn);
        if !head.is_present() {
            return Ok(Entry {
                status: status::PRESENT | status::FRESH | status::READ | status::WRITE,
                time: time as u32,
                ..Entry::default()
            });
        }
        let e = self.free_versions.pop().ok_or_else(|| {
            NvmmError::new(
                ErrorKind::Exhausted,
                "the page table's version area is full",
            )
        })?;
        self.set(e, head);
        Ok(Entry {
            flash_page: 0,
            prev: e,
            valid: 0,
            time: time as u32,
            status: head.status & !(status::MAPPED | status::FRESH),
        })
    }

    pub fn has_free_version(&self) -> bool {
        !self.free_versions.is_empty()
    }

    /// Entries changed since the last call (the delta of a commit record).
    pub fn take_changes(&mut self) -> Vec<(u32, Entry)> {
        let list = std::mem::take(&mut self.changed_list);
        list.into_iter()
            .map(|i| {
                self.changed[i as usize] = false;
                (i, self.entries[i as usize])
            })
            .collect()
    }

    /// Every entry in use (a full commit record).
    pub fn present(&self) -> Vec<(u32, Entry)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_present())
            .map(|(i, e)| (i as u32, *e))
            .collect()
    }

    pub fn present_count(&self) -> usize {
        self.entries.iter().filter(|e| e.is_present()).count()
    }
}

/// Bits of a page's segments, for sub-page valid bit masks.
pub const ALL_SEGMENTS: u32 = (1 << SEGMENTS_PER_PAGE) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    fn written(t: &mut Table, vpn: u64, time: u64, flash_page: u64, valid: u32) {
        let mut e = t.push_version(vpn, time).unwrap();
        e.status |= status::MAPPED | status::ALLOCATED;
        e.flash_page = flash_page;
        e.valid = valid;
        t.set(vpn as u32, e);
    }

    #[test]
    fn partial_versions_compose_and_time_travel() {
        let mut t = Table::new(4).unwrap();
        written(&mut t, 1, 1, 80, ALL_SEGMENTS);
        written(&mut t, 1, 2, 160, 0b0010_0100); // segments 2 and 5
        assert_eq!(t.locate(1, 2, None), Some(162));
        assert_eq!(t.locate(1, 3, None), Some(83));
        assert_eq!(t.locate(1, 2, Some(1)), Some(82));
        assert_eq!(t.locate(1, 2, Some(0)), None);
        assert_eq!(t.chain(1).len(), 2);
        assert_eq!(t.versions_used(), 1);
        // A tombstone hides everything older, for now but not for time 2.
        let mut tomb = t.push_version(1, 3).unwrap();
        tomb.status = status::PRESENT | status::FRESH | status::READ | status::WRITE;
        t.set(1, tomb);
        assert_eq!(t.locate(1, 3, None), None);
        assert_eq!(t.locate(1, 3, Some(2)), Some(83));
        let back = Table::from_entries(4, t.present()).unwrap();
        assert_eq!(back.versions_used(), 2);
        assert_eq!(back.locate(1, 5, Some(2)), Some(165));
    }

    #[test]
    fn the_version_area_is_bounded() {
        let mut t = Table::new(1).unwrap();
        for time in 1..=4 {
            written(&mut t, 0, time, time * 8, 1);
        }
        assert_eq!(t.versions_used(), 3);
        assert_eq!(t.push_version(0, 5).unwrap_err().kind, ErrorKind::Exhausted);
    }
}
