//! The 16-byte page-table entry of SPEC §7, bit for bit, for both faces of
//! NVMM (issue 24: one codec, one set of status bits): the simulator's
//! journal (`journal.rs`) and libnvmm's table and log. 34 bits flash page
//! mapping (the first flash page of the version's block), 30 bits previous
//! mapping index (the version chain), 32 sub-page valid bits, 24 bits time
//! written (a Lamport time in libnvmm, a write counter in the simulator), 8
//! bits status and permissions ([`status`]).
//!
//! [`Pte`] is the packed form (what a table holds, 16 bytes), [`Entry`] the
//! fields unpacked for code that edits them.
//!
//! Sub-page valid bits: bit `d·k + s` says segment `s` of the 64 KB page is
//! at flash page `mapping + s + d·k` (d = segments per page, k = 0 .. 32/d):
//! a version owns a flash block of 32 pages. The report uses positions
//! +8/+16/+24 to skip worn-out pages (the simulator does); a file has none,
//! so libnvmm uses them for what the same bits also allow: a segment
//! written back again before the next sync goes to its next free position
//! in the same (uncommitted) block — each flash page is still programmed
//! once — instead of forcing a new version. The `segment_*` helpers of
//! [`Entry`] are for libnvmm's 8 KB flash pages (d = 8); the `_in` forms
//! take d, the `_at` form d's [`positions_mask`] (the page table's walk).

/// Segments (flash pages, cache blocks) per virtual page with 8 KB flash
/// pages (libnvmm's, the report's example): 64 KB / 8 KB.
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

/// One packed 16-byte entry (the report's layout; see the module header).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Pte(pub u128);

impl Pte {
    /// Pack the fields; `time` keeps its low 24 bits (the simulator's write
    /// counter wraps).
    #[inline]
    pub fn new(mapping: u64, prev: u32, vector: u32, time: u32, status: u8) -> Pte {
        debug_assert!(mapping <= MAX_FLASH_PAGE);
        debug_assert!(u64::from(prev) < MAX_TABLE_ENTRIES);
        let time = time & ((1 << TIME_BITS) - 1);
        Pte(u128::from(mapping)
            | u128::from(prev) << FLASH_PAGE_BITS
            | u128::from(vector) << 64
            | u128::from(time) << 96
            | u128::from(status) << 120)
    }
    /// Flash page of segment 0's first position.
    #[inline]
    pub fn mapping(self) -> u64 {
        (self.0 & ((1 << FLASH_PAGE_BITS) - 1)) as u64
    }
    /// Index of the previous version's entry; 0 is none (entry 0 is a head).
    #[inline]
    pub fn prev(self) -> u32 {
        ((self.0 >> FLASH_PAGE_BITS) & ((1 << PREV_BITS) - 1)) as u32
    }
    #[inline]
    pub fn vector(self) -> u32 {
        (self.0 >> 64) as u32
    }
    #[inline]
    pub fn time(self) -> u32 {
        ((self.0 >> 96) & ((1 << TIME_BITS) - 1)) as u32
    }
    #[inline]
    pub fn status(self) -> u8 {
        (self.0 >> 120) as u8
    }
    #[inline]
    pub fn present(self) -> bool {
        self.status() & status::PRESENT != 0
    }
    /// The version owns a block of flash pages.
    #[inline]
    pub fn mapped(self) -> bool {
        self.status() & status::MAPPED != 0
    }
    /// The flash page holding `segment` in this version, with `d` segments
    /// per page, if it holds it.
    #[inline]
    pub fn segment_flash_page_in(self, segment: u32, d: u32) -> Option<u64> {
        self.segment_flash_page_at(segment, positions_mask(d))
    }
    /// [`segment_flash_page_in`](Self::segment_flash_page_in) with
    /// `positions_mask(d)` computed once by the caller: the vector's bits
    /// for `segment` are every d-th from bit `segment`, and its first
    /// position is the lowest of them that is set.
    #[inline]
    pub fn segment_flash_page_at(self, segment: u32, positions: u32) -> Option<u64> {
        let held = (self.vector() >> segment) & positions;
        (held != 0).then(|| self.mapping() + u64::from(segment + held.trailing_zeros()))
    }
}

/// Bits 0, d, 2d, … of a 32-bit vector (d segments per page): segment
/// 0's positions; segment s's are these shifted up by s.
pub const fn positions_mask(d: u32) -> u32 {
    let mut mask = 0;
    let mut k = 0;
    while k < 32 / d {
        mask |= 1 << (k * d);
        k += 1;
    }
    mask
}

impl From<Pte> for Entry {
    fn from(p: Pte) -> Entry {
        Entry {
            flash_page: p.mapping(),
            prev: p.prev(),
            valid: p.vector(),
            time: p.time(),
            status: p.status(),
        }
    }
}

impl From<Entry> for Pte {
    fn from(e: Entry) -> Pte {
        debug_assert!(e.time as u64 <= MAX_TIME);
        Pte::new(e.flash_page, e.prev, e.valid, e.time, e.status)
    }
}

/// The fields of an entry, unpacked.
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

    /// The 16 bytes as stored (little-endian).
    pub fn pack(&self) -> [u8; 16] {
        Pte::from(*self).0.to_le_bytes()
    }

    pub fn unpack(bytes: [u8; 16]) -> Entry {
        Pte(u128::from_le_bytes(bytes)).into()
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
        let p = Pte::new((1 << 34) - 1, (1 << 30) - 1, 0xDEAD_BEEF, 0xFF_FFFF, 0xA5);
        assert_eq!(
            (p.mapping(), p.prev(), p.vector(), p.time(), p.status()),
            ((1 << 34) - 1, (1 << 30) - 1, 0xDEAD_BEEF, 0xFF_FFFF, 0xA5)
        );
        assert_eq!(std::mem::size_of::<Pte>(), 16);
        // 16 KB flash pages: 4 segments, 8 positions.
        let q = Pte::new(64, 0, 1 << (4 * 5 + 3), 1, status::PRESENT | status::MAPPED);
        assert_eq!(q.segment_flash_page_in(3, 4), Some(64 + 3 + 20));
        assert_eq!(q.segment_flash_page_in(2, 4), None);
        assert_eq!(positions_mask(8), 0x0101_0101);
        assert_eq!(positions_mask(32), 1);
        // Every segment, position and d against the definition: the first
        // k with bit k·d + s set.
        let mut x = 0x9E37_79B9u32;
        for d in [1, 2, 4, 8, 16, 32] {
            for _ in 0..200 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let p = Pte::new(1000, 0, x & x >> 3, 1, status::PRESENT | status::MAPPED);
                for s in 0..d {
                    let want = (0..32 / d)
                        .find(|k| p.vector() >> (k * d + s) & 1 == 1)
                        .map(|k| 1000 + u64::from(s + k * d));
                    assert_eq!(p.segment_flash_page_in(s, d), want, "d {d} s {s}");
                }
            }
        }
    }
}
