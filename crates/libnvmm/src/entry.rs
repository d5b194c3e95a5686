//! The 16-byte page-table entry of SPEC §7, bit for bit: 34 bits flash page
//! mapping (the first flash page of the version's block), 30 bits previous
//! mapping index (the version chain), 32 sub-page valid bits, 24 bits time
//! written (a Lamport time), 8 bits status and permissions.
//!
//! Sub-page valid bits: bit `8k + s` says segment `s` of the 64 KB page is at
//! flash page `mapping + s + 8k` (k = 0..3): a version owns a flash block of
//! 32 pages. The report uses positions +8/+16/+24 to skip worn-out pages; a
//! file has none, so this library uses them for what the same bits also
//! allow: a segment written back again before the next sync goes to its
//! next free position in the same (uncommitted) block — each flash page is
//! still programmed once — instead of forcing a new version.

/// Segments (flash pages, cache blocks) per virtual page: 64 KB / 8 KB.
pub const SEGMENTS_PER_PAGE: usize = 8;
/// Positions a segment can take in its version's block (32 valid bits).
pub const POSITIONS: usize = 4;
/// Flash pages in the block a version owns.
pub const FLASH_PAGES_PER_BLOCK: u64 = (SEGMENTS_PER_PAGE * POSITIONS) as u64;
pub const FLASH_PAGE_BITS: u32 = 34;
pub const PREV_BITS: u32 = 30;
pub const TIME_BITS: u32 = 24;
/// The largest Lamport time an entry can hold; syncs beyond it fail.
pub const MAX_TIME: u64 = (1 << TIME_BITS) - 1;
/// The largest table (direct part plus versions) a 30-bit index reaches.
pub const MAX_TABLE_ENTRIES: u64 = 1 << PREV_BITS;
pub const MAX_FLASH_PAGE: u64 = (1 << FLASH_PAGE_BITS) - 1;

/// Status bits (the entry's top byte).
pub mod status {
    /// The entry holds a version.
    pub const PRESENT: u8 = 0x01;
    /// The version owns a block of flash pages (`flash_page` is valid).
    pub const MAPPED: u8 = 0x02;
    /// Segments this version lacks are zero, not inherited from older
    /// versions: the page was deleted (or first created) here.
    pub const FRESH: u8 = 0x04;
    /// The page exists (allocated or written); clear in a delete's tombstone.
    pub const ALLOCATED: u8 = 0x08;
    pub const READ: u8 = 0x10;
    pub const WRITE: u8 = 0x20;
    /// Collected when the application that made it temporary ends.
    pub const TEMPORARY: u8 = 0x40;
    pub const PERMS: u8 = READ | WRITE | TEMPORARY;
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub flash_page: u64,
    pub prev: u32,
    pub valid: u32,
    pub time: u32,
    pub status: u8,
}

impl Entry {
    pub fn is_present(&self) -> bool {
        self.status & status::PRESENT != 0
    }
    pub fn has(&self, bit: u8) -> bool {
        self.status & bit != 0
    }
    /// The position `k` at which this version holds `segment`, if it does.
    pub fn segment_position(&self, segment: usize) -> Option<usize> {
        (0..POSITIONS).find(|k| self.valid & (1 << (segment + SEGMENTS_PER_PAGE * k)) != 0)
    }
    pub fn segment_valid(&self, segment: usize) -> bool {
        self.segment_position(segment).is_some()
    }
    /// The flash page holding `segment` in this version.
    pub fn segment_flash_page(&self, segment: usize) -> Option<u64> {
        self.segment_position(segment)
            .map(|k| self.flash_page + (segment + SEGMENTS_PER_PAGE * k) as u64)
    }

    pub fn pack(&self) -> [u8; 16] {
        debug_assert!(self.flash_page <= MAX_FLASH_PAGE);
        debug_assert!((self.prev as u64) < MAX_TABLE_ENTRIES);
        debug_assert!(self.time as u64 <= MAX_TIME);
        let word: u128 = (self.flash_page as u128 & ((1 << FLASH_PAGE_BITS) - 1))
            | ((self.prev as u128 & ((1 << PREV_BITS) - 1)) << 34)
            | ((self.valid as u128) << 64)
            | ((self.time as u128 & ((1 << TIME_BITS) - 1)) << 96)
            | ((self.status as u128) << 120);
        word.to_le_bytes()
    }

    pub fn unpack(bytes: [u8; 16]) -> Entry {
        let word = u128::from_le_bytes(bytes);
        Entry {
            flash_page: (word & ((1 << FLASH_PAGE_BITS) - 1)) as u64,
            prev: ((word >> 34) & ((1 << PREV_BITS) - 1)) as u32,
            valid: (word >> 64) as u32,
            time: ((word >> 96) & ((1 << TIME_BITS) - 1)) as u32,
            status: (word >> 120) as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_is_sixteen_bytes_and_round_trips_at_every_field_limit() {
        let e = Entry {
            flash_page: MAX_FLASH_PAGE,
            prev: (MAX_TABLE_ENTRIES - 1) as u32,
            valid: u32::MAX,
            time: MAX_TIME as u32,
            status: 0xff,
        };
        assert_eq!(Entry::unpack(e.pack()), e);
        let e = Entry {
            flash_page: 53,
            prev: 7,
            valid: 0b1110_1101,
            time: 9,
            status: status::PRESENT | status::MAPPED,
        };
        assert_eq!(Entry::unpack(e.pack()), e);
        assert_eq!(Entry::unpack([0; 16]), Entry::default());
        // Fields do not bleed into each other.
        let only_prev = Entry {
            prev: 1,
            ..Entry::default()
        };
        assert_eq!(u128::from_le_bytes(only_prev.pack()), 1 << 34);
    }
}
