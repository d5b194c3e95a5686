//! libnvmm's page table: the NVMM page table of the model crate
//! (`moneta_model::nvmm::page_table`, shared with the simulator's journal
//! since issue 24: one codec, one set of version chains, one victim order)
//! with the report's three previous versions per page, 8 KB segments and
//! change tracking for the log's commit records. This module adds what is
//! libnvmm's own: its size limit, its memory estimate and its errors.

use crate::entry::{MAX_TABLE_ENTRIES, SEGMENTS_PER_PAGE};
use crate::error::{ErrorKind, NvmmError, Result};
pub use moneta_model::nvmm::page_table::{longest_first, PageTable as Table, TableError};

/// Previous versions per page in the upper area (the report's 1B entries
/// for 256M pages of 64 KB).
pub const VERSIONS_PER_PAGE: u64 = 3;

/// The largest region, in 64 KB pages: a 30-bit entry index reaches 2^30
/// entries, four per page (the head and three versions): 16 TiB.
pub const MAX_PAGES: u64 = MAX_TABLE_ENTRIES / (1 + VERSIONS_PER_PAGE);

/// Table entries (heads and versions) of a region of `pages` pages.
pub fn entries_for(pages: u64) -> u64 {
    pages.saturating_mul(1 + VERSIONS_PER_PAGE)
}

/// Bytes of memory the table of `pages` pages takes (16-byte entries,
/// change flags, free list).
pub fn memory_bytes(pages: u64) -> u64 {
    entries_for(pages).saturating_mul(16 + 1 + 4)
}

/// The table of a region of `pages` pages.
pub fn new(pages: u64) -> Result<Table> {
    if pages == 0 || pages > MAX_PAGES {
        return Err(NvmmError::new(
            ErrorKind::InvalidArgument,
            format!("{pages} pages: a region has 1 ..= {MAX_PAGES} pages of 64 KB (16 TiB)"),
        ));
    }
    Ok(Table::new(
        pages,
        VERSIONS_PER_PAGE,
        SEGMENTS_PER_PAGE as u32,
        true,
    )?)
}

/// A table holding `entries` (recovery); rejects indexes out of range.
pub fn from_entries(pages: u64, entries: impl IntoIterator<Item = (u32, Entry)>) -> Result<Table> {
    let mut t = new(pages)?;
    t.load(entries)?;
    Ok(t)
}

use crate::entry::Entry;

impl From<TableError> for NvmmError {
    fn from(e: TableError) -> NvmmError {
        let kind = match e {
            TableError::TooLarge(_) => ErrorKind::InvalidArgument,
            TableError::NoMemory(_) | TableError::Full => ErrorKind::Exhausted,
            TableError::BadIndex(_) => ErrorKind::BadFile,
        };
        NvmmError::new(kind, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_limit_and_its_errors() {
        assert_eq!(
            new(MAX_PAGES + 1).err().map(|e| e.kind),
            Some(ErrorKind::InvalidArgument)
        );
        let mut t = new(1).unwrap();
        assert_eq!(t.pages(), 1);
        assert_eq!(
            t.load([(9, Entry::default())])
                .map_err(NvmmError::from)
                .unwrap_err()
                .kind,
            ErrorKind::BadFile
        );
        assert_eq!(NvmmError::from(TableError::Full).kind, ErrorKind::Exhausted);
    }
}
