//! The NVMM page table and its version chains (SPEC §7 "page table entry",
//! "journaling"), one implementation for both faces (issue 24): the
//! simulator's journal (`journal.rs`, virtual time, physical flash pages
//! with wear) and libnvmm (real memory, a log file as the flash).
//!
//! A direct table indexed by virtual page number holds each page's newest
//! version (its head); an upper, non-indexable area of `versions_per_page`
//! entries per page (3 in the report: 1B entries for 16 TB) holds older
//! versions linked by the previous-mapping index. An update is the report's
//! pseudo-code: copy `table[VPN]` to a free upper entry E, set
//! `table[VPN].prev = E`, write the new mapping, vector and time into the
//! head ([`PageTable::push_version`]). Index 0 is page 0's head, never a
//! previous version, so `prev == 0` ends a chain.
//!
//! Garbage collection's choice of victims is here too: chains are
//! consolidated longest first, ties by page number ([`longest_first`]).
//!
//! Pure bookkeeping: which flash page holds a segment (at a time), which
//! entries changed since the last commit (libnvmm's log records them; the
//! simulator turns the tracking off). Flash pages are the caller's.

use super::entry::{positions_mask, status, Entry, Pte, MAX_TABLE_ENTRIES};

/// Why a table could not be made or changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableError {
    /// More entries than a 30-bit index reaches, or no page.
    TooLarge(String),
    /// The allocator refused the table's memory.
    NoMemory(String),
    /// No free upper entry for a previous version.
    Full,
    /// An index out of range (a corrupt record).
    BadIndex(u32),
}

impl std::fmt::Display for TableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableError::TooLarge(m) | TableError::NoMemory(m) => write!(f, "{m}"),
            TableError::Full => write!(f, "the page table's version area is full"),
            TableError::BadIndex(i) => write!(f, "table index {i} out of range"),
        }
    }
}

/// A vector of `n` copies of `value`, or an error when the allocator
/// refuses (never an abort).
pub fn try_filled<T: Clone>(n: u64, value: T, what: &str) -> Result<Vec<T>, TableError> {
    let refused = || TableError::NoMemory(format!("cannot allocate {n} entries for {what}"));
    let n = usize::try_from(n).map_err(|_| refused())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| refused())?;
    v.resize(n, value);
    Ok(v)
}

struct Changes {
    flag: Vec<bool>,
    list: Vec<u32>,
}

pub struct PageTable {
    pages: u64,
    versions_per_page: u64,
    segments_per_page: u32,
    /// `positions_mask(segments_per_page)`, for `locate`.
    positions: u32,
    entries: Vec<Pte>,
    free_versions: Vec<u32>,
    changes: Option<Changes>,
}

impl PageTable {
    /// A table of `pages` heads and `versions_per_page` upper entries per
    /// page, for pages of `segments_per_page` segments; `track_changes`
    /// records changed entries for [`PageTable::take_changes`].
    pub fn new(
        pages: u64,
        versions_per_page: u64,
        segments_per_page: u32,
        track_changes: bool,
    ) -> Result<PageTable, TableError> {
        let total = pages.saturating_mul(1 + versions_per_page);
        if pages == 0 || total > MAX_TABLE_ENTRIES {
            return Err(TableError::TooLarge(format!(
                "{pages} pages with {versions_per_page} versions each: a table has 1 ..= 2^30 entries"
            )));
        }
        let mut free_versions = Vec::new();
        free_versions
            .try_reserve_exact((total - pages) as usize)
            .map_err(|_| TableError::NoMemory("cannot allocate the free version list".into()))?;
        // Popped from the end: the lowest indexes are used first.
        free_versions.extend((pages as u32..total as u32).rev());
        let changes = if track_changes {
            Some(Changes {
                flag: try_filled(total, false, "the page table's change flags")?,
                list: Vec::new(),
            })
        } else {
            None
        };
        Ok(PageTable {
            pages,
            versions_per_page,
            segments_per_page,
            positions: positions_mask(segments_per_page),
            entries: try_filled(total, Pte::default(), "the page table")?,
            free_versions,
            changes,
        })
    }

    /// Load `entries` (recovery) into a fresh table.
    pub fn load(
        &mut self,
        entries: impl IntoIterator<Item = (u32, Entry)>,
    ) -> Result<(), TableError> {
        for (index, e) in entries {
            let slot = self
                .entries
                .get_mut(index as usize)
                .ok_or(TableError::BadIndex(index))?;
            *slot = e.into();
        }
        let pages = self.pages as u32;
        let entries = &self.entries;
        self.free_versions
            .retain(|&i| i >= pages && !entries[i as usize].present());
        Ok(())
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }
    pub fn segments_per_page(&self) -> u32 {
        self.segments_per_page
    }
    pub fn version_capacity(&self) -> u64 {
        self.pages * self.versions_per_page
    }
    pub fn versions_used(&self) -> u64 {
        self.version_capacity() - self.free_versions.len() as u64
    }
    pub fn has_free_version(&self) -> bool {
        !self.free_versions.is_empty()
    }

    #[inline]
    pub fn pte(&self, index: u32) -> Pte {
        self.entries[index as usize]
    }
    pub fn get(&self, index: u32) -> Entry {
        self.pte(index).into()
    }
    pub fn head(&self, vpn: u64) -> Entry {
        self.get(vpn as u32)
    }

    #[inline]
    pub fn set_pte(&mut self, index: u32, p: Pte) {
        self.entries[index as usize] = p;
        if let Some(c) = &mut self.changes {
            if !c.flag[index as usize] {
                c.flag[index as usize] = true;
                c.list.push(index);
            }
        }
    }
    pub fn set(&mut self, index: u32, e: Entry) {
        self.set_pte(index, e.into());
    }

    /// Clear an upper entry and return it to the free list.
    pub fn free_version(&mut self, index: u32) {
        debug_assert!(index as u64 >= self.pages);
        self.set_pte(index, Pte::default());
        self.free_versions.push(index);
    }

    /// Make room for a new head of `vpn` written at `time`: a present head
    /// moves to a free upper entry E and the returned head (not yet stored)
    /// has `prev = E` and the old head's permissions; an absent head gives
    /// a fresh one. `Full` when the upper area has no free entry.
    pub fn push_version(&mut self, vpn: u64, time: u64) -> Result<Entry, TableError> {
        let head = self.pte(vpn as u32);
        if !head.present() {
            return Ok(Entry {
                status: status::PRESENT | status::FRESH | status::READ | status::WRITE,
                time: time as u32,
                ..Entry::default()
            });
        }
        let e = self.free_versions.pop().ok_or(TableError::Full)?;
        self.set_pte(e, head);
        Ok(Entry {
            flash_page: 0,
            prev: e,
            valid: 0,
            time: time as u32,
            status: head.status() & !(status::MAPPED | status::FRESH),
        })
    }

    /// Indexes of `vpn`'s versions, newest first.
    pub fn chain(&self, vpn: u64) -> Vec<u32> {
        let mut out = Vec::new();
        let mut index = vpn as u32;
        loop {
            let e = self.pte(index);
            if !e.present() {
                return out;
            }
            out.push(index);
            if e.prev() == 0 {
                return out;
            }
            index = e.prev();
            assert!(
                out.len() as u64 <= self.version_capacity() + 1,
                "cycle in chain of page {vpn}"
            );
        }
    }

    pub fn chain_len(&self, vpn: u64) -> usize {
        let mut n = 0;
        let mut e = self.pte(vpn as u32);
        while e.present() {
            n += 1;
            if e.prev() == 0 {
                break;
            }
            e = self.pte(e.prev());
        }
        n
    }

    /// The flash page holding `segment` of `vpn` as of time `at` (None:
    /// now) and how many entries were read to find it (the controller's
    /// translation cost); None when it reads as zero (never written, or
    /// deleted by a FRESH version).
    #[inline]
    pub fn locate(&self, vpn: u64, segment: u32, at: Option<u64>) -> Option<(u64, u32)> {
        let mut e = self.pte(vpn as u32);
        let mut hops = 1;
        while e.present() {
            if at.is_none_or(|t| u64::from(e.time()) <= t) {
                if e.mapped() {
                    if let Some(fp) = e.segment_flash_page_at(segment, self.positions) {
                        return Some((fp, hops));
                    }
                }
                if e.status() & status::FRESH != 0 {
                    return None;
                }
            }
            if e.prev() == 0 {
                return None;
            }
            e = self.pte(e.prev());
            hops += 1;
        }
        None
    }

    /// Entries changed since the last call (a commit record's delta);
    /// empty when tracking is off.
    pub fn take_changes(&mut self) -> Vec<(u32, Entry)> {
        let Some(c) = &mut self.changes else {
            return Vec::new();
        };
        let list = std::mem::take(&mut c.list);
        list.into_iter()
            .map(|i| {
                c.flag[i as usize] = false;
                (i, self.entries[i as usize].into())
            })
            .collect()
    }

    /// Every entry in use (a full commit record).
    pub fn present(&self) -> Vec<(u32, Entry)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.present())
            .map(|(i, e)| (i as u32, (*e).into()))
            .collect()
    }

    pub fn present_count(&self) -> usize {
        self.entries.iter().filter(|e| e.present()).count()
    }
}

/// Garbage collection's victim order (SPEC §7: "free blocks from the
/// longest chains first"): the pages whose chains have more than one
/// version, longest first, then by page number. A counting sort: chains
/// are a few versions long, and a comparison sort of every page was a
/// visible share of a simulator run.
pub fn longest_first(chain_len: &[u16]) -> Vec<u32> {
    let longest = chain_len.iter().copied().max().unwrap_or(0) as usize;
    // next[l]: where the next page with a chain of l goes.
    let mut next = vec![0usize; longest + 2];
    for &l in chain_len {
        if l > 1 {
            next[l as usize] += 1;
        }
    }
    let mut at = 0;
    for l in (2..=longest).rev() {
        let count = next[l];
        next[l] = at;
        at += count;
    }
    let mut order = vec![0u32; at];
    for (vpn, &l) in chain_len.iter().enumerate() {
        if l > 1 {
            order[next[l as usize]] = vpn as u32;
            next[l as usize] += 1;
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(t: &mut PageTable, vpn: u64, time: u64, flash_page: u64, valid: u32) {
        let mut e = t.push_version(vpn, time).unwrap();
        e.status |= status::MAPPED | status::ALLOCATED;
        e.flash_page = flash_page;
        e.valid = valid;
        t.set(vpn as u32, e);
    }

    #[test]
    fn partial_versions_compose_and_time_travel() {
        let mut t = PageTable::new(4, 3, 8, true).unwrap();
        written(&mut t, 1, 1, 80, 0xFF);
        written(&mut t, 1, 2, 160, 0b0010_0100); // segments 2 and 5
        assert_eq!(t.locate(1, 2, None), Some((162, 1)));
        assert_eq!(t.locate(1, 3, None), Some((83, 2)));
        assert_eq!(t.locate(1, 2, Some(1)), Some((82, 2)));
        assert_eq!(t.locate(1, 2, Some(0)), None);
        assert_eq!(t.chain(1).len(), 2);
        assert_eq!(t.versions_used(), 1);
        // A tombstone hides everything older, for now but not for time 2.
        let mut tomb = t.push_version(1, 3).unwrap();
        tomb.status = status::PRESENT | status::FRESH | status::READ | status::WRITE;
        t.set(1, tomb);
        assert_eq!(t.locate(1, 3, None), None);
        assert_eq!(t.locate(1, 3, Some(2)), Some((83, 3)));
        let mut back = PageTable::new(4, 3, 8, true).unwrap();
        back.load(t.present()).unwrap();
        assert_eq!(back.versions_used(), 2);
        assert_eq!(back.locate(1, 5, Some(2)), Some((165, 2)));
        assert_eq!(t.take_changes().len(), 3, "head 1 and two upper entries");
        assert!(t.take_changes().is_empty());
    }

    #[test]
    fn the_version_area_is_bounded() {
        let mut t = PageTable::new(1, 3, 8, false).unwrap();
        for time in 1..=4 {
            written(&mut t, 0, time, time * 32, 1);
        }
        assert_eq!(t.versions_used(), 3);
        assert_eq!(t.push_version(0, 5).unwrap_err(), TableError::Full);
        assert!(t.take_changes().is_empty(), "tracking is off");
        assert!(matches!(
            PageTable::new(1 << 29, 3, 8, false),
            Err(TableError::TooLarge(_))
        ));
    }

    #[test]
    fn victims_are_the_longest_chains_then_the_lowest_pages() {
        assert_eq!(longest_first(&[1, 3, 2, 3, 0, 2]), vec![1, 3, 2, 5]);
        assert!(longest_first(&[1, 1, 0]).is_empty());
    }
}
